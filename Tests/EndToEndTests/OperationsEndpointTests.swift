import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import Testing
import UploadAgent
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
}
