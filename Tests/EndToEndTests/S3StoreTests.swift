import Foundation
import Logging
import NIOCore
import Testing
import UploadAgent
import UploadRelay
import UploadRelayS3Store
import UploadS3
import UploadTestSupport

/// The relay with its objects in an S3 bucket (issue 10), against the real SeaweedFS tools/test starts: every object
/// read back from the bucket byte for byte.
@Suite("End to end: an S3 store (SeaweedFS)")
struct S3StoreTests {
    /// The relay's S3 settings for `bucket` of the run's server.
    static func configuration(_ server: S3TestServer, bucket: String) -> S3StoreConfiguration {
        S3StoreConfiguration(endpoint: server.endpoint, credentials: server.credentials, bucket: bucket, prefix: "relay")
    }

    static func object(_ client: S3Client, _ bucket: String, _ key: String) async throws -> Data? {
        guard let info = try await client.headObject(bucket: bucket, key: key) else { return nil }
        let bytes = try await client.getObject(bucket: bucket, key: key, maxBytes: Int(info.size) + 1)
        return Data(bytes.readableBytesView)
    }

    /// Kills `relay` with SIGKILL once its catalog records a part (5 MiB or more durable), from a process of its own
    /// (tools/s3/kill-after-part.py): on a loaded machine this test process may not look in time, and the upload would
    /// end first. Waits for the relay to exit; whether the watcher killed it (and what it said, when not).
    static func killAfterPart(_ relay: ChildProcess, catalog: [String]) async -> (killed: Bool, said: String) {
        let watcher = Process()
        watcher.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        watcher.arguments =
            [
                "python3", packageRoot + "/tools/s3/kill-after-part.py", "--pid", "\(relay.process.processIdentifier)",
                "--bytes", "\(5 << 20)", "--timeout", "60",
            ] + catalog
        let errors = Pipe()
        watcher.standardError = errors
        do {
            try watcher.run()
        } catch {
            relay.kill(SIGKILL)
            return (false, "\(error)")
        }
        let said = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        watcher.waitUntilExit()
        if watcher.terminationStatus != 0 { relay.kill(SIGKILL) }
        _ = relay.waitForExit()
        return (watcher.terminationStatus == 0, said)
    }

    @Test(
        "a long upload recorded at its OPEN is recorded again under its multipart upload's name at its first part, so that a resume finds what is durable"
    )
    func recordedAtOpenFindsItsParts() async throws {
        let server = try S3TestServer()
        try await S3TestServer.withBucket { _, bucket in
            let relay = try await TestRelay(s3: Self.configuration(server, bucket: bucket)) {
                $0.syncBytes = 1 << 20
            }.start()
            // The source stalls at 8 MiB, past the first part (5 MiB), until the checks are done: the upload cannot end
            // (its session and parts gone with its commit) before they look, however loaded the machine.
            let video = PatternSource(size: 14 << 20, stallAt: 8 << 20)
            let sending = Task {
                try await upload(
                    [UploadItem(key: "long.mov", displayPath: "long.mov", source: video, dedup: false)],
                    port: relay.port, token: relay.token, ca: relay.caPath
                )
            }
            do {
                var seen: UploadSession? = nil
                let recorded = try await Polling.eventually(timeout: 30) {
                    seen = try await relay.parts.catalog.session(account: "dev", key: "long.mov")
                    return (seen?.durableOffset ?? 0) > 0
                }
                #expect(recorded, "no durable bytes recorded: \(String(describing: seen))")
                if let session = seen {
                    #expect(
                        try await relay.parts.store.hasStaging(session.stagingName),
                        "the catalog names a staging the store does not have: \(session.stagingName)")
                    #expect(try await !relay.parts.catalog.stagedParts(sessionID: session.id).isEmpty)
                }
            } catch {
                video.release()
                _ = try? await sending.value
                throw error
            }
            video.release()
            #expect(try await sending.value.first?.status == .stored)
            await relay.stop()
        }
    }

    @Test("photos as one PutObject each, a video as a multipart upload: every object exact in the bucket, no upload left open, the spool empty")
    func photosAndVideo() async throws {
        let server = try S3TestServer()
        try await S3TestServer.withBucket { client, bucket in
            let relay = try await TestRelay(s3: Self.configuration(server, bucket: bucket)).start()
            let source = TestRelay.makeDirectory()
            var files = [(key: String, data: Data)]()
            var items: [UploadItem] = []
            for index in 0..<12 {
                let file = makeFile(source, "IMG_\(index).jpg", size: 20_000 + index * 997, seed: UInt64(100 + index))
                files.append(("photos/IMG_\(index).jpg", file.data))
                items.append(UploadItem(key: "photos/IMG_\(index).jpg", displayPath: file.path, source: FileSource(path: file.path)))
            }
            let video = makeFile(source, "clip.mp4", size: (21 << 20) + 333, seed: 7)
            files.append(("videos/clip.mp4", video.data))
            items.append(UploadItem(key: "videos/clip.mp4", displayPath: video.path, source: FileSource(path: video.path)))
            let results = try await upload(items, port: relay.port, token: relay.token, ca: relay.caPath)
            #expect(results.count == files.count)
            #expect(results.allSatisfy { $0.status == .stored }, "\(results.compactMap(\.error))")
            for (key, data) in files {
                #expect(try await Self.object(client, bucket, "relay/dev/" + key) == data, "\(key)")
            }
            #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "").isEmpty)
            #expect((try? FileManager.default.contentsOfDirectory(atPath: relay.parts.configuration.spoolDirectory)) == [])
            // The same bytes under another key: a server-side copy, nothing sent.
            let again = try await upload(
                [UploadItem(key: "copy/clip.mp4", displayPath: video.path, source: FileSource(path: video.path))],
                port: relay.port, token: relay.token, ca: relay.caPath
            )
            #expect(again.first?.status == .deduplicated, "\(again.first?.error ?? "")")
            #expect(again.first?.sentBytes == 0)
            #expect(try await Self.object(client, bucket, "relay/dev/copy/clip.mp4") == video.data)
            await relay.stop()
        }
    }

    @Test("a key taken in the bucket behind the relay's back is never replaced without --overwrite (If-None-Match), and is with it")
    func ifNoneMatch() async throws {
        let server = try S3TestServer()
        try await S3TestServer.withBucket { client, bucket in
            let relay = try await TestRelay(s3: Self.configuration(server, bucket: bucket)).start()
            let theirs = ByteBuffer(string: "someone else's bytes")
            try await client.putObject(bucket: bucket, key: "relay/dev/taken.jpg", body: theirs)
            let source = TestRelay.makeDirectory()
            // One small (PutObject) and one large (CompleteMultipartUpload): both conditional.
            for size in [5_000, (11 << 20) + 1] {
                let file = makeFile(source, "taken-\(size).jpg", size: size, seed: UInt64(size))
                let item = UploadItem(key: "taken.jpg", displayPath: file.path, source: FileSource(path: file.path))
                let refused = try await upload([item], port: relay.port, token: relay.token, ca: relay.caPath) { $0.maxAttemptsPerItem = 1 }
                #expect(refused.first?.status == .failed)
                #expect(refused.first?.error?.contains("ALREADY_EXISTS") == true, "\(refused.first?.error ?? "")")
                #expect(try await Self.object(client, bucket, "relay/dev/taken.jpg") == Data(theirs.readableBytesView))
                // The refused upload's parts go as the relay lets go of it, right after the refusal went out.
                #expect(try await Polling.eventually { try await client.listMultipartUploads(bucket: bucket, prefix: "").isEmpty })
            }
            let file = makeFile(source, "mine.jpg", size: 7_000, seed: 3)
            let item = UploadItem(key: "taken.jpg", displayPath: file.path, source: FileSource(path: file.path))
            let replaced = try await upload([item], port: relay.port, token: relay.token, ca: relay.caPath) { $0.overwrite = true }
            #expect(replaced.first?.status == .stored, "\(replaced.first?.error ?? "")")
            #expect(try await Self.object(client, bucket, "relay/dev/taken.jpg") == file.data)
            await relay.stop()
        }
    }

    @Test("a key that the relay's prefix and the account make too long for S3: INVALID_KEY at OPEN, before a byte is sent")
    func keyTooLongForS3() async throws {
        let server = try S3TestServer()
        try await S3TestServer.withBucket { client, bucket in
            let relay = try await TestRelay(s3: Self.configuration(server, bucket: bucket)).start()
            let source = TestRelay.makeDirectory()
            let file = makeFile(source, "a.jpg", size: 10_000, seed: 5)
            // 1,019 bytes: a valid key, but "relay/dev/" before it makes 1,029.
            let key = (0..<5).map { String(repeating: Character(String($0)), count: 203) }.joined(separator: "/")
            let results = try await upload(
                [UploadItem(key: key, displayPath: file.path, source: FileSource(path: file.path))], port: relay.port, token: relay.token,
                ca: relay.caPath
            )
            #expect(results.first?.status == .failed)
            #expect(results.first?.error?.contains("INVALID_KEY") == true, "\(results.first?.error ?? "")")
            #expect(results.first?.error?.contains("at most 1024") == true, "\(results.first?.error ?? "")")
            #expect(results.first?.sentBytes == 0)
            #expect(try await client.listObjects(bucket: bucket, prefix: "").isEmpty)
            await relay.stop()
        }
    }

    @Test("an agent killed midway: its session expires and its multipart upload is aborted, parts and all")
    func expiryAborts() async throws {
        let server = try S3TestServer()
        try await S3TestServer.withBucket { client, bucket in
            let relay = try await TestRelay(s3: Self.configuration(server, bucket: bucket)).start()
            let source = TestRelay.makeDirectory()
            let file = makeFile(source, "long.mov", size: 32 << 20, seed: 41)
            let agent = try AgentProcess(
                ["send", "--no-state", "--no-dedup", "--quiet", "--bwlimit", "8M", file.path],
                environment: AgentProcess.environment(relay, state: source + "/state"), log: source + "/agent.log"
            )
            let catalog = relay.parts.catalog
            func session() async -> UploadSession? { (try? await catalog.sessions(updatedBefore: .distantFuture))?.first }
            // Killed once a part is acknowledged: its session and multipart upload stay behind.
            let acknowledged = try await Polling.eventually(timeout: 30) { (await session()?.durableOffset ?? 0) >= 5 << 20 }
            agent.stop(SIGKILL)
            #expect(acknowledged, "no part was acknowledged: \(agent.child.log)")
            // The relay lets go of the cut upload (whole parts made durable on the way out), then stops.
            await relay.stop()
            let left = try #require(await session())
            let parts = try await catalog.stagedParts(sessionID: left.id)
            #expect(parts.last?.end == left.durableOffset, "parts \(parts.map { ($0.number, $0.end) }), durable \(left.durableOffset)")
            #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "").count == 1)
            var logger = Logger(label: "test-expiry")
            logger.logLevel = .critical
            try await RelayRuntime.cleanUp(catalog: catalog, store: relay.parts.store, expiry: .zero, logger: logger)
            #expect(await session() == nil)
            #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "").isEmpty)
            #expect(try await client.headObject(bucket: bucket, key: "relay/dev/long.mov") == nil)
        }
    }

    @Test(
        "kill -9 of the relay midway through a multipart upload, a restart on the same catalog: the same upload goes on, the object exact, re-sent at most a window and a part"
    )
    func killRelayMidway() async throws {
        let server = try S3TestServer()
        let binary = try relayBinary()
        try await S3TestServer.withBucket { client, bucket in
            let data = TestRelay.makeDirectory()
            let source = TestRelay.makeDirectory()
            let size = 48 << 20
            let file = makeFile(source, "raw.dng", size: size, seed: 31)
            var environment = ProcessInfo.processInfo.environment
            environment["AWS_ACCESS_KEY_ID"] = server.credentials.accessKeyID
            environment["AWS_SECRET_ACCESS_KEY"] = server.credentials.secretAccessKey
            func startRelay(port: Int) async throws -> (ChildProcess, Int) {
                let child = try ChildProcess(
                    binary,
                    [
                        "serve", "--dev", "--data", data, "--listen", "127.0.0.1:\(port)", "--ready-file", data + "/ready",
                        "--store", "s3://\(bucket)/relay", "--s3-endpoint", server.endpoint.url.absoluteString,
                        "--s3-region", server.endpoint.region, "--log-level", "warning",
                    ],
                    readyFile: data + "/ready", logFile: data + "/relay.log", environment: environment
                )
                return await (child, try child.waitUntilReady())
            }
            var (relay, port) = try await startRelay(port: 0)
            let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            let (firstPort, path) = (port, file.path)
            let uploadTask = Task {
                try await upload(
                    [UploadItem(key: "raw.dng", displayPath: path, source: FileSource(path: path))],
                    port: firstPort, token: token, ca: data + "/dev/ca.pem",
                    configure: {
                        $0.dedup = false
                        $0.retryFor = .seconds(60)
                        $0.bandwidthLimit = 16 << 20
                    }
                )
            }
            // Killed once the relay recorded a part (its catalog says so; the agent's events may lag on a loaded machine).
            let kill = await Self.killAfterPart(relay, catalog: ["--sqlite", data + "/catalog.sqlite"])
            #expect(kill.killed, "no part recorded: \(kill.said) \(relay.log)")
            // The acknowledged bytes are in the parts of the one open multipart upload; no object yet.
            let open = try await client.listMultipartUploads(bucket: bucket, prefix: "relay/dev/")
            #expect(open.count == 1)
            if let upload = open.first {
                #expect(try await client.listParts(bucket: bucket, key: upload.key, uploadID: upload.uploadID).count >= 1)
            }
            #expect(try await client.headObject(bucket: bucket, key: "relay/dev/raw.dng") == nil)
            (relay, port) = try await startRelay(port: port)
            let results = try await uploadTask.value
            #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
            #expect(try await Self.object(client, bucket, "relay/dev/raw.dng") == file.data)
            #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "").isEmpty)
            // Re-sent: what was in flight (a stream window, 8 MiB) and what waited for its part (8 MiB and a write batch,
            // at most 2 MiB: UploadPipeline's batchBytes).
            let resent = Int(results.first?.sentBytes ?? 0) - size
            #expect(resent <= (8 << 20) + (8 << 20) + (2 << 20), "re-sent \(resent) bytes")
            relay.kill(SIGTERM)
            #expect(await relay.exited() == 0, "relay did not exit 0 on SIGTERM: \(relay.log)")
        }
    }

    @Test(
        "two relays, one PostgreSQL catalog, one bucket: relay A killed midway through a multipart upload, relay B (its own data directory) takes its address and finishes the same upload; the object exact"
    )
    func anotherRelayContinues() async throws {
        let server = try S3TestServer()
        let binary = try relayBinary()
        try await S3TestServer.withBucket { client, bucket in
            try await PostgresTestDatabase.with { catalogURL in
                let (dataA, dataB) = (TestRelay.makeDirectory(), TestRelay.makeDirectory())
                let source = TestRelay.makeDirectory()
                let size = 32 << 20
                let file = makeFile(source, "take.mov", size: size, seed: 51)
                var environment = ProcessInfo.processInfo.environment
                environment["AWS_ACCESS_KEY_ID"] = server.credentials.accessKeyID
                environment["AWS_SECRET_ACCESS_KEY"] = server.credentials.secretAccessKey
                environment["UPLOAD_RELAY_CATALOG"] = catalogURL
                // The account, in the shared catalog: either relay knows its token.
                let made = try await CommandLineTests.run(binary, ["token", "add", "camera", "--data", dataA], environment: environment)
                #expect(made.status == 0, "\(made.stderr)")
                let token = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
                func startRelay(data: String, port: Int, _ tls: [String]) async throws -> (ChildProcess, Int) {
                    let child = try ChildProcess(
                        binary,
                        [
                            "serve", "--data", data, "--listen", "127.0.0.1:\(port)", "--ready-file", data + "/ready", "--store",
                            "s3://\(bucket)/relay",
                            "--s3-endpoint", server.endpoint.url.absoluteString, "--log-level", "warning",
                        ] + tls,
                        readyFile: data + "/ready", logFile: data + "/relay.log", environment: environment
                    )
                    return await (child, try child.waitUntilReady())
                }
                // Relay A makes the certificates (--dev) that relay B serves too: the agent trusts one CA.
                var (relay, port) = try await startRelay(data: dataA, port: 0, ["--dev"])
                let tls = ["--cert", dataA + "/dev/server.pem", "--key", dataA + "/dev/server-key.pem"]
                // The agent as its own process: nothing it does waits for this test process's threads.
                let agent = try AgentProcess(
                    // 8 MB/s: the first part is recorded after a second, the last long after a poll on a loaded machine sees it.
                    ["send", "--json", "--quiet", "--no-state", "--no-dedup", "--bwlimit", "8M", "--retry-for", "60s", file.path],
                    environment: [
                        "UPLOAD_RELAY": "127.0.0.1:\(port)", "UPLOAD_CA": dataA + "/dev/ca.pem", "UPLOAD_TOKEN": token,
                        "XDG_STATE_HOME": source + "/state",
                    ],
                    log: source + "/agent.log"
                )
                let kill = await Self.killAfterPart(relay, catalog: ["--postgres", catalogURL])
                #expect(kill.killed, "no part recorded: \(kill.said) \(relay.log)")
                let open = try await client.listMultipartUploads(bucket: bucket, prefix: "relay/camera/")
                #expect(open.count == 1, "relay A's multipart upload is open")
                (relay, port) = try await startRelay(data: dataB, port: port, tls)
                #expect(await agent.child.exited() == 0, "\(agent.child.log)")
                let result = try #require(agent.events.first { $0["key"] as? String == "take.mov" }, "\(agent.child.log)")
                #expect(result["status"] as? String == "stored", "\(result)")
                #expect(try await Self.object(client, bucket, "relay/camera/take.mov") == file.data)
                #expect(try await client.listMultipartUploads(bucket: bucket, prefix: "").isEmpty, "relay B completed relay A's upload")
                let resent = (result["sent_bytes"] as? Int ?? 0) - size
                #expect(resent <= (8 << 20) + (8 << 20) + (1 << 20), "re-sent \(resent) bytes")
                // Relay B recorded the object in the shared catalog.
                let listed = try await CommandLineTests.run(binary, ["token", "list", "--bytes", "--data", dataB], environment: environment)
                #expect(listed.stdout.contains("camera\t\(size)\t"), "\(listed.stdout)")
                relay.kill(SIGTERM)
                #expect(await relay.exited() == 0, "relay B did not exit 0 on SIGTERM: \(relay.log)")
            }
        }
    }
}
