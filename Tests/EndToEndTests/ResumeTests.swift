import Foundation
import Testing
import UploadAgent
import UploadProtocol
import UploadRelay
import UploadTestSupport

/// Breaks in the link or the relay, and the resume that follows.
@Suite("End to end: resume after breaks", .serialized)
struct ResumeTests {

    /// `upload-relay serve --dev` on `data`, at `port` (0: any), with `options`: the process and the port it listens on.
    static func startRelay(_ binary: String, data: String, port: Int, _ options: [String] = []) async throws -> (ChildProcess, Int) {
        let child = try ChildProcess(
            binary,
            ["serve", "--dev", "--data", data, "--listen", "127.0.0.1:\(port)", "--ready-file", data + "/ready"] + options + [
                "--log-level", "warning",
            ],
            readyFile: data + "/ready", logFile: data + "/relay.log"
        )
        return await (child, try child.waitUntilReady())
    }

    @Test(
        "the link is cut at a random point: the upload completes and only the remainder plus at most one window is sent again",
        arguments: [UInt64(1), 2, 3])
    func cutLink(seed: UInt64) async throws {
        let relay = try await TestRelay { $0.syncBytes = 1 << 20 }.start()
        let directory = TestRelay.makeDirectory()
        let size = 24 << 20
        let file = makeFile(directory, "video.mp4", size: size, seed: seed)
        let (proxy, proxyPort) = try await startProxy(
            target: relay.port, directory: directory,
            ["--cut-random", String(seed), "--cut-min", String(4 << 20), "--cut-max", String(20 << 20)]
        )
        defer { proxy.kill(SIGTERM) }
        let reconnects = Counter()
        let results = try await upload(
            [UploadItem(key: "video.mp4", displayPath: file.path, source: FileSource(path: file.path))],
            port: proxyPort, token: relay.token, ca: relay.caPath, configure: { $0.dedup = false }
        ) { event in
            if case .reconnecting = event { reconnects.increment() }
        }
        let result = try #require(results.first)
        #expect(result.status == .stored, "\(result.error ?? "")")
        #expect(relay.stored("video.mp4") == file.data)
        #expect(reconnects.value >= 1, "the proxy did not cut the link")
        // Sent again: what was in flight (at most the connection window) and not yet durable.
        let resent = Int(result.sentBytes) - size
        #expect(resent >= 0)
        #expect(resent <= relay.parts.configuration.limits.connectionWindow, "resent \(resent) bytes")
        await relay.stop()
    }

    @Test("a byte corrupted on the wire is caught (by TLS here), never committed, and the upload resumes")
    func corruptedOnTheWire() async throws {
        let relay = try await TestRelay().start()
        let directory = TestRelay.makeDirectory()
        let file = makeFile(directory, "doc.pdf", size: 6 << 20, seed: 5)
        let (proxy, proxyPort) = try await startProxy(target: relay.port, directory: directory, ["--corrupt-at", String(3 << 20)])
        defer { proxy.kill(SIGTERM) }
        let results = try await upload(
            [UploadItem(key: "doc.pdf", displayPath: file.path, source: FileSource(path: file.path))],
            port: proxyPort, token: relay.token, ca: relay.caPath
        )
        #expect(results.first?.status == .stored)
        #expect(relay.stored("doc.pdf") == file.data)
        let log = (try? String(contentsOfFile: directory + "/proxy.log", encoding: .utf8)) ?? ""
        #expect(log.contains("corrupt@"), "the proxy did not corrupt: \(log)")
        await relay.stop()
    }

    @Test("a link that goes silent (no FIN, no RST) is detected by PING and the upload resumes on a new connection")
    func silentLink() async throws {
        let relay = try await TestRelay().start()
        let directory = TestRelay.makeDirectory()
        let file = makeFile(directory, "silent.bin", size: 2 << 20, seed: 21)
        // The first connection delays everything by 10 minutes: a black hole. Later connections are clean.
        let (proxy, proxyPort) = try await startProxy(target: relay.port, directory: directory, ["--delay-ms", "600000"])
        defer { proxy.kill(SIGTERM) }
        let reasons = EventLog()
        let results = try await upload(
            [UploadItem(key: "silent.bin", displayPath: file.path, source: FileSource(path: file.path))],
            port: proxyPort, token: relay.token, ca: relay.caPath, configure: { $0.keepaliveInterval = .milliseconds(300) },
            onEvent: { reasons.append($0) }
        )
        #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
        #expect(relay.stored("silent.bin") == file.data)
        let noticed = reasons.all.contains { event in
            if case .reconnecting(let reason, _) = event { return reason.contains("no answer from the relay") }
            return false
        }
        #expect(noticed)
        await relay.stop()
    }

    @Test("kill -9 of the relay midway, then a restart: the agent completes; no partial object is ever visible")
    func killRelay() async throws {
        let binary = try relayBinary()
        let data = TestRelay.makeDirectory()
        let source = TestRelay.makeDirectory()
        let size = 48 << 20
        let file = makeFile(source, "raw.dng", size: size, seed: 8)
        func startRelay(port: Int) async throws -> (ChildProcess, Int) {
            try await Self.startRelay(binary, data: data, port: port, ["--sync-bytes", "1M"])
        }
        var (relay, port) = try await startRelay(port: 0)
        let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let sent = SentCounter()
        let objectPath = data + "/store/dev/raw.dng"
        let watcher = PartialObjectWatcher(path: objectPath, expectedSize: size)
        watcher.start()
        let firstPort = port
        let path = file.path
        let uploadTask = Task {
            try await upload(
                [UploadItem(key: "raw.dng", displayPath: path, source: FileSource(path: path))],
                port: firstPort, token: token, ca: data + "/dev/ca.pem",
                configure: {
                    $0.dedup = false
                    $0.retryFor = .seconds(60)
                    // 8 MiB/s: the kill lands 4 s before the end even with the whole suite running (at 32 MiB/s, once,
                    // the last 32 MiB went before the test's task ran again after its wait).
                    $0.bandwidthLimit = 8 << 20
                }
            ) { event in
                if case .sent(_, let bytes) = event { sent.add(bytes) }
            }
        }
        await sent.wait(for: 16 << 20)
        relay.kill(SIGKILL)
        _ = relay.waitForExit()
        #expect(!FileManager.default.fileExists(atPath: objectPath), "an object appeared before the upload finished")
        (relay, port) = try await startRelay(port: port)
        let results = try await uploadTask.value
        watcher.stop()
        #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
        #expect(FileManager.default.contents(atPath: objectPath) == file.data)
        #expect(!watcher.sawPartial, "a partial object was visible under the key")
        // The resumed upload did not start over: less than the whole file was sent twice.
        #expect(Int(results.first!.sentBytes) < 2 * size)
        relay.kill(SIGTERM)
        #expect(await relay.exited() == 0, "relay did not exit 0 on SIGTERM: \(relay.log)")
    }

    @Test(
        "a striped upload whose relay was killed midway through stripe 0: a new agent run, with no SHA-1 state kept, hashes the durable prefix back, sends the rest and the other stripes, and commits"
    )
    func stripedResumeInANewRun() async throws {
        let binary = try relayBinary()
        let data = TestRelay.makeDirectory()
        let source = TestRelay.makeDirectory()
        let size = (20 << 20) + 5
        let file = makeFile(source, "long.mov", size: size, seed: 21)
        func startRelay(port: Int) async throws -> (ChildProcess, Int) {
            try await Self.startRelay(binary, data: data, port: port, ["--sync-bytes", "1M"])
        }
        var (relay, port) = try await startRelay(port: 0)
        let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let path = file.path
        let items = [UploadItem(key: "long.mov", displayPath: path, source: FileSource(path: path))]
        let prefixDurable = SentCounter()
        let firstPort = port
        let first = Task {
            try await upload(
                items, port: firstPort, token: token, ca: data + "/dev/ca.pem",
                configure: {
                    $0.dedup = false
                    $0.connections = 2
                    $0.adaptiveConnections = false
                    $0.retryFor = .milliseconds(300)
                    // 4 MiB/s: the kill lands seconds before stripe 0's end, even on a loaded machine (at loopback speed all
                    // may be committed first; at 16 MiB/s, with the whole suite running, the event came after the commit once).
                    $0.bandwidthLimit = 4 << 20
                }
            ) { event in
                // 4 MiB of stripe 0 durable: about 12 MiB of the two stripes are left to send, 3 s at 4 MiB/s, so the upload
                // cannot have been committed when the relay is killed (at 8 MiB, half a second was left: with the whole
                // suite's disk load delaying the relay's syncs, and so its ACKs, the commit came first once).
                if case .acknowledged(_, let offset) = event, offset >= 4 << 20 { prefixDurable.add(1) }
            }
        }
        await prefixDurable.wait(for: 1)
        relay.kill(SIGKILL)
        _ = relay.waitForExit()
        let failed = try await first.value
        #expect(failed.first?.status == .failed)
        (relay, port) = try await startRelay(port: port)
        let results = try await upload(
            [UploadItem(key: "long.mov", displayPath: path, source: FileSource(path: path))], port: port, token: token,
            ca: data + "/dev/ca.pem",
            configure: {
                $0.dedup = false
                $0.connections = 2
                $0.adaptiveConnections = false
            }
        )
        #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
        #expect(results.first?.stripes == 2)
        // 4 MiB of stripe 0 were durable: the new run did not send them again.
        #expect((results.first?.sentBytes ?? .max) <= UInt64(size - (4 << 20)))
        #expect(FileManager.default.contents(atPath: data + "/store/dev/long.mov") == file.data)
        relay.kill(SIGTERM)
        #expect(await relay.exited() == 0, "relay did not exit 0 on SIGTERM: \(relay.log)")
    }

    @Test("SIGTERM: the relay says GOAWAY, makes in-flight bytes durable, exits 0; the agent resumes on a restart")
    func gracefulShutdown() async throws {
        let binary = try relayBinary()
        let data = TestRelay.makeDirectory()
        let source = TestRelay.makeDirectory()
        let size = 32 << 20
        let file = makeFile(source, "clip.mov", size: size, seed: 12)
        func startRelay(port: Int) async throws -> (ChildProcess, Int) { try await Self.startRelay(binary, data: data, port: port) }
        var (relay, port) = try await startRelay(port: 0)
        let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let sent = SentCounter()
        let firstPort = port
        let path = file.path
        let uploadTask = Task {
            try await upload(
                [UploadItem(key: "clip.mov", displayPath: path, source: FileSource(path: path))],
                port: firstPort, token: token, ca: data + "/dev/ca.pem", configure: { $0.dedup = false }
            ) { event in
                if case .sent(_, let bytes) = event { sent.add(bytes) }
            }
        }
        await sent.wait(for: 8 << 20)
        relay.kill(SIGTERM)
        #expect(await relay.exited() == 0, "relay did not exit 0 on SIGTERM: \(relay.log)")
        (relay, port) = try await startRelay(port: port)
        let results = try await uploadTask.value
        #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
        #expect(FileManager.default.contents(atPath: data + "/store/dev/clip.mov") == file.data)
        relay.kill(SIGTERM)
        _ = relay.waitForExit()
    }
}

/// Looks at the object's path on a background thread, often, and remembers whether it ever held fewer bytes than expected.
final class PartialObjectWatcher: @unchecked Sendable {
    let path: String
    let expectedSize: Int
    private let lock = NSLock()
    private var running = true
    private var partial = false
    private var thread: Thread? = nil

    init(path: String, expectedSize: Int) {
        self.path = path
        self.expectedSize = expectedSize
    }

    func start() {
        let thread = Thread { [self] in
            while self.isRunning {
                if let attributes = try? FileManager.default.attributesOfItem(atPath: self.path),
                    let size = attributes[.size] as? Int, size != self.expectedSize
                {
                    self.lock.lock()
                    self.partial = true
                    self.lock.unlock()
                }
                usleep(2_000)
            }
        }
        self.thread = thread
        thread.start()
    }

    private var isRunning: Bool {
        self.lock.lock()
        defer { self.lock.unlock() }
        return self.running
    }

    func stop() {
        self.lock.lock()
        self.running = false
        self.lock.unlock()
    }

    var sawPartial: Bool {
        self.lock.lock()
        defer { self.lock.unlock() }
        return self.partial
    }
}
