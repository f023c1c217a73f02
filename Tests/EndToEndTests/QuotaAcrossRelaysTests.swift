import Foundation
import NIOConcurrencyHelpers
import Testing
import UploadAgent
import UploadTestSupport

/// An account's quota across several relays sharing one PostgreSQL catalog (issue 10), with real agents: an upload
/// open through one relay holds the size it announced on the others, so a relay refuses at OPEN what would overrun the
/// quota beside it instead of letting two uploads through of which only one can commit.
@Suite("End to end: quota across relays (PostgreSQL)")
struct QuotaAcrossRelaysEndToEndTests {
    @Test(
        "an upload open through relay A holds its size on relay B: B refuses at OPEN what would overrun the quota beside it, admits what fits, and both commit"
    )
    func openElsewhereCounts() async throws {
        try await PostgresTestDatabase.with { url in
            let a = try await TestRelay(catalogURL: url).start()
            // B has a data directory of its own, with A's dev certificates (the accounts are in the shared catalog).
            let directoryB = TestRelay.makeDirectory()
            try FileManager.default.copyItem(atPath: a.directory + "/dev", toPath: directoryB + "/dev")
            let b = try await TestRelay(directory: directoryB, catalogURL: url).start()
            let token = try await a.addAccount("phone", quota: 5 << 20)
            let source = TestRelay.makeDirectory()
            defer { try? FileManager.default.removeItem(atPath: source) }
            let video = makeFile(source, "clip.mp4", size: 3 << 20, seed: 21)
            let large = makeFile(source, "large.jpg", size: 3 << 20, seed: 22)
            let small = makeFile(source, "small.jpg", size: 1 << 20, seed: 23)
            func item(_ file: (path: String, data: Data), _ key: String) -> UploadItem {
                UploadItem(key: key, displayPath: file.path, source: FileSource(path: file.path))
            }

            // The video goes through A at 512 KiB/s: open for about 6 s.
            let sent = NIOLockedValueBox(0)
            let sending = Task {
                try await upload([item(video, "videos/clip.mp4")], port: a.port, token: token, ca: a.caPath) {
                    $0.bandwidthLimit = 512 << 10
                } onEvent: { event in
                    if case .sent(_, let bytes) = event { sent.withLockedValue { $0 += bytes } }
                }
            }
            // Bytes sent: A admitted it (its OPEN was answered), and has recorded what it announced.
            guard try await Polling.eventually(timeout: 30, { sent.withLockedValue { $0 } >= 64 << 10 }) else {
                Issue.record("the video through relay A never started")
                await b.stop()
                await a.stop()
                _ = try? await sending.value  // fails once its retries end
                return
            }
            let refused = try await upload([item(large, "photos/large.jpg")], port: b.port, token: token, ca: b.caPath)
            #expect(refused.first?.status == .failed, "relay B admitted 3 MiB beside A's open 3 MiB in a 5 MiB quota")
            #expect(refused.first?.error?.contains("held by unfinished uploads") == true, "\(refused.first?.error ?? "")")
            #expect(refused.first?.sentBytes == 0, "refused at OPEN, before any byte")
            let fits = try await upload([item(small, "photos/small.jpg")], port: b.port, token: token, ca: b.caPath)
            #expect(fits.first?.status == .stored, "\(fits.first?.error ?? "")")

            let results = try await sending.value
            #expect(results.first?.status == .stored, "the video through A: \(results.first?.error ?? "")")
            #expect(a.stored("videos/clip.mp4", account: "phone") == video.data)
            #expect(b.stored("photos/small.jpg", account: "phone") == small.data)
            #expect(b.stored("photos/large.jpg", account: "phone") == nil)
            await b.stop()
            await a.stop()
        }
    }
}
