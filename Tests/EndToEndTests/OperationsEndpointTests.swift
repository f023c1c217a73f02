import AsyncHTTPClient
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing
@_spi(Testing) @testable import UploadAgent
import UploadRelay
import UploadTestSupport

/// The operations endpoint (`--metrics-listen`): `/healthz`, `/readyz` and `/metrics` in plain HTTP, without a token,
/// counting what agents really did; nothing else is served there.
@Suite("End to end: the operations endpoint")
struct OperationsEndpointTests {
    static func relay() async throws -> TestRelay {
        try await TestRelay { configuration in
            configuration.operations = .operations(host: "127.0.0.1", port: 0)
            configuration.syncBytes = 256 << 10
        }
    }

    struct Answer {
        var status: Int
        var contentType: String
        var body: String
    }

    static func get(_ client: HTTPClient, port: Int, _ path: String, method: HTTPMethod = .GET) async throws -> Answer {
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)\(path)")
        request.method = method
        let response = try await client.execute(request, timeout: .seconds(20))
        let body = try await response.body.collect(upTo: 4 << 20)
        return Answer(
            status: Int(response.status.code), contentType: response.headers.first(name: "content-type") ?? "",
            body: String(decoding: body.readableBytesView, as: UTF8.self)
        )
    }

    /// The value of the sample `name` (with its labels as written, e.g. `x{code="A"}`) in a Prometheus text body.
    static func sample(_ body: String, _ name: String) -> Double? {
        for line in body.split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: " ")
            if parts.count >= 2, parts[0] == name { return Double(parts[1]) }
        }
        return nil
    }

    @Test("probes answer without a token, and /metrics counts the uploads, bytes and refusals agents caused")
    func metricsAndHealth() async throws {
        let relay = try await Self.relay().start()
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        let source = TestRelay.makeDirectory()
        defer {
            try? FileManager.default.removeItem(atPath: source)
            try? FileManager.default.removeItem(atPath: relay.directory)
        }
        do {
            let port = relay.operationsPort
            let alive = try await Self.get(client, port: port, "/healthz")
            #expect(alive.status == 200 && alive.body.contains("\"alive\":true"), "\(alive)")
            let ready = try await Self.get(client, port: port, "/readyz")
            #expect(ready.status == 200, "\(ready)")
            #expect(ready.body.contains("\"ready\":true") && ready.body.contains("\"catalog\":\"ok\""), "\(ready.body)")

            // One video stored, the same bytes under a second key (deduplicated), one upload refused by quota.
            let video = makeFile(source, "video.mp4", size: 3 << 20 | 12345, seed: 7)
            let results = try await upload(
                [
                    UploadItem(key: "video.mp4", displayPath: video.path, source: FileSource(path: video.path)),
                    UploadItem(key: "copy/video.mp4", displayPath: video.path, source: FileSource(path: video.path)),
                ],
                port: relay.port, token: relay.token, ca: relay.caPath,
                // 4 MiB/s: the relay syncs along the way (at full speed the HASH may come first, and the commit makes
                // every byte durable with no sync before it).
                configure: {
                    $0.concurrency = 1
                    $0.bandwidthLimit = 4 << 20
                }
            )
            #expect(results.map(\.status) == [.stored, .deduplicated], "\(results)")
            let small = try await relay.addAccount("small", quota: 1000)
            let refused = try await upload(
                [UploadItem(key: "big.bin", displayPath: video.path, source: FileSource(path: video.path))],
                port: relay.port, token: small, ca: relay.caPath, configure: { $0.retryFor = .zero }
            )
            #expect(refused.map(\.status) == [.failed], "\(refused)")

            let metrics = try await Self.get(client, port: port, "/metrics")
            #expect(metrics.status == 200)
            #expect(metrics.contentType.hasPrefix("text/plain; version=0.0.4"), "\(metrics.contentType)")
            let size = Double(video.data.count)
            #expect(Self.sample(metrics.body, "upload_relay_committed_bytes_total") == size, "\(metrics.body)")
            #expect(Self.sample(metrics.body, "upload_relay_uploads_committed_total") == 1)
            #expect(Self.sample(metrics.body, "upload_relay_uploads_deduplicated_total") == 1)
            #expect(Self.sample(metrics.body, "upload_relay_deduplicated_bytes_total") == size)
            #expect(Self.sample(metrics.body, "upload_relay_upload_failures_total{code=\"QUOTA_EXCEEDED\"}") == 1, "\(metrics.body)")
            #expect((Self.sample(metrics.body, "upload_relay_received_bytes_total") ?? 0) >= size)
            #expect((Self.sample(metrics.body, "upload_relay_durable_bytes_total") ?? 0) > 0, "no sync counted: \(metrics.body)")
            #expect((Self.sample(metrics.body, "upload_relay_sync_seconds_count") ?? 0) > 0)
            #expect(Self.sample(metrics.body, "upload_relay_commit_seconds_count") == 1)
            #expect(Self.sample(metrics.body, "upload_relay_connections_accepted_total") == 2)
            #expect(Self.sample(metrics.body, "upload_relay_ready") == 1)
            #expect(Self.sample(metrics.body, "upload_relay_sessions_staged") == 0)
            #expect((Self.sample(metrics.body, "upload_relay_disk_free_bytes") ?? 0) > 0)
            #expect(!metrics.body.contains("video.mp4"), "a key in the metrics")

            // Only the operations paths; read-only.
            let status = try await Self.get(client, port: port, "/v1/status?key=video.mp4")
            #expect(status.status == 404 && status.body.contains("/metrics"), "\(status)")
            let post = try await Self.get(client, port: port, "/metrics", method: .POST)
            #expect(post.status == 405, "\(post)")

            // Shutting down: no longer ready, so a balancer sends new agents elsewhere.
            relay.server.shutdown()
            let draining = try await Self.get(client, port: port, "/readyz")
            #expect(draining.status == 503, "\(draining)")
            #expect(draining.body.contains("\"accepting\":\"the relay is shutting down\""), "\(draining.body)")
        } catch {
            try? await client.shutdown()
            await relay.stop()
            throw error
        }
        try await client.shutdown()
        await relay.stop()
    }

    /// A relay with its operations endpoint, an HTTP client, an event loop group for an agent and a source directory,
    /// for `body`; each stopped or removed after it, thrown or not.
    static func withAgentAndRelay(
        _ body: (TestRelay, HTTPClient, MultiThreadedEventLoopGroup, String) async throws -> Void
    ) async throws {
        let relay = try await Self.relay().start()
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        let source = TestRelay.makeDirectory()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? FileManager.default.removeItem(atPath: source) }
        let outcome: Result<Void, any Error>
        do {
            try await body(relay, client, group, source)
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        try? await client.shutdown()
        try? await group.shutdownGracefully()
        await relay.stop()
        try? FileManager.default.removeItem(atPath: relay.directory)
        try outcome.get()
    }

    @Test(
        "a quota plan's connection kept for the uploads that follow: the relay accepts one connection for both, the files stored; not kept, or no run to take it, two and none left open; no quota, no plan, the connection kept all the same"
    )
    func quotaPlanConnectionKept() async throws {
        try await Self.withAgentAndRelay { relay, client, group, source in
            let files = (0..<3).map { makeFile(source, "p\($0).jpg", size: 40_000 + $0, seed: UInt64(60 + $0)) }
            func items(_ prefix: String) -> [UploadItem] {
                files.map {
                    UploadItem(key: prefix + "/" + ($0.path as NSString).lastPathComponent, displayPath: $0.path, source: FileSource(path: $0.path))
                }
            }
            let request = { (prefix: String) in QuotaPlan.Request(entries: items(prefix).map { ($0.key, UInt64(40_000)) }, overwrite: false) }
            // An account with a quota: the relay grants it quota plans (SPEC §7.2).
            let token = try await relay.addAccount("planned", quota: 1 << 30)
            let uploader = Uploader(
                configuration: AgentConfiguration(relayHost: "127.0.0.1", relayPort: relay.port, token: token, caPath: relay.caPath),
                group: group, logger: Logger(label: "test-agent")
            )
            func accepted() async throws -> Double? {
                Self.sample(try await Self.get(client, port: relay.operationsPort, "/metrics").body, "upload_relay_connections_accepted_total")
            }
            func open() async throws -> Double? {
                Self.sample(try await Self.get(client, port: relay.operationsPort, "/metrics").body, "upload_relay_connections")
            }

            let plan = try await uploader.quotaPlan(request("kept"), keepConnection: true)
            #expect(plan?.fits == true)
            let kept = try await uploader.upload(items("kept"))
            #expect(kept.map(\.status) == [.stored, .stored, .stored], "\(kept)")
            #expect(try await accepted() == 1, "the plan and the uploads on one connection")

            _ = try await uploader.quotaPlan(request("apart"))
            let apart = try await uploader.upload(items("apart"))
            #expect(apart.map(\.status) == [.deduplicated, .deduplicated, .deduplicated], "\(apart)")
            #expect(try await accepted() == 3, "not kept: a connection for the plan, one for the uploads")

            // Kept, and no run takes it (nothing to send): let go, it closes.
            _ = try await uploader.quotaPlan(request("unused"), keepConnection: true)
            await uploader.letGoOfKeptConnection()
            #expect(try await accepted() == 4)
            #expect(await Polling.waitUntil(timeout: 10) { (try? await open()) == 0 }, "the kept connection closed")
            for file in files {
                #expect(
                    FileManager.default.contents(atPath: relay.directory + "/store/planned/kept/" + (file.path as NSString).lastPathComponent)
                        == file.data)
            }

            // An account with no quota is granted no plan (every selection fits): no answer, and the connection is kept
            // for the uploads all the same.
            let free = Uploader(
                configuration: AgentConfiguration(relayHost: "127.0.0.1", relayPort: relay.port, token: relay.token, caPath: relay.caPath),
                group: group, logger: Logger(label: "test-agent")
            )
            let none = try await free.quotaPlan(request("free"), keepConnection: true)
            #expect(none == nil)
            let freeResults = try await free.upload(items("free"))
            #expect(freeResults.map(\.status) == [.stored, .stored, .stored], "\(freeResults)")
            #expect(try await accepted() == 5, "no plan, and the uploads on the connection kept for it")
        }
    }

    @Test(
        "on a long link the first step's connections open beside the quota plan's, and the run takes them: 4 accepted in all, not 7; let go when no run takes them"
    )
    func warmConnectionsTaken() async throws {
        try await Self.withAgentAndRelay { relay, client, group, source in
            // Worth it: four of the kernel's largest send buffers at least (16 MiB with Linux's defaults); striped, so
            // stripes wait for the first step.
            let size = Int(ConnectionGrowth.firstStep) * max(4 << 20, Uploader.kernelSendBufferLimit()) + (1 << 20)
            let file = makeFile(source, "long.mp4", size: size, seed: 64)
            func item(_ prefix: String) -> UploadItem {
                UploadItem(key: prefix + "/long.mp4", displayPath: file.path, source: FileSource(path: file.path))
            }
            // An account with a quota, so that a plan is asked (SPEC §7.2).
            let token = try await relay.addAccount("planned", quota: 1 << 40)
            var configuration = AgentConfiguration(relayHost: "127.0.0.1", relayPort: relay.port, token: token, caPath: relay.caPath)
            configuration.faults.assumedRoundTrip = .milliseconds(50)
            configuration.dedup = false
            // Four seconds at least: the first decision finds stripes waiting, also on a machine busy with the whole suite.
            configuration.bandwidthLimit = max(1, size / 4)
            let uploader = Uploader(configuration: configuration, group: group, logger: Logger(label: "test-agent"))
            func metric(_ name: String) async throws -> Double? {
                Self.sample(try await Self.get(client, port: relay.operationsPort, "/metrics").body, name)
            }

            let plan = try await uploader.quotaPlan(
                QuotaPlan.Request(entries: [(item("warm").key, UInt64(size))], overwrite: false), keepConnection: true)
            #expect(plan?.fits == true)
            #expect(
                await Polling.waitUntil(timeout: 10) { (try? await metric("upload_relay_connections_accepted_total")) == 4 },
                "the plan's connection and three beside it")
            let said = NIOLockedValueBox<[Int]>([])
            let results = try await uploader.upload([item("warm")]) { event in
                if case .connections(let count, _) = event { said.withLockedValue { $0.append(count) } }
            }
            #expect(results.map(\.status) == [.stored], "\(results)")
            #expect(said.withLockedValue { $0.first } == 4, "\(said.withLockedValue { $0 })")
            #expect(try await metric("upload_relay_connections_accepted_total") == 4, "the run took the three, dialing none")
            #expect(FileManager.default.contents(atPath: relay.directory + "/store/planned/warm/long.mp4") == file.data)

            // Opened, and no run takes them: let go with the plan's, all closed.
            _ = try await uploader.quotaPlan(QuotaPlan.Request(entries: [(item("unused").key, UInt64(size))], overwrite: false), keepConnection: true)
            #expect(await Polling.waitUntil(timeout: 10) { (try? await metric("upload_relay_connections_accepted_total")) == 8 })
            await uploader.letGoOfKeptConnection()
            #expect(await Polling.waitUntil(timeout: 10) { (try? await metric("upload_relay_connections")) == 0 }, "all four closed")
        }
    }
}
