import Foundation
import NIOCore
import Testing
import UploadRelay
import UploadS3
import UploadTestSupport

/// `upload-relay rm` and `token delete` through the binary, on SQLite with the local store and on PostgreSQL with an
/// S3 bucket: only what the catalog records is removed, object and row together; two accounts' same keys stay apart;
/// a file changed by hand is left alone; deleting an account asks what happens to its objects.
@Suite("End to end: rm and token delete", .serialized)
struct AdminTests {
    static func send(_ files: [String], token: String, port: Int, ca: String, prefix: String? = nil) async throws -> Int32 {
        let run = try await CommandLineTests.run(
            try CommandLineTests.agentBinary(),
            ["send", "--no-state", "--relay", "127.0.0.1:\(port)", "--ca", ca, "--token", token] + (prefix.map { ["--prefix", $0] } ?? []) + files
        )
        return run.status
    }

    @Test(
        "SQLite and the local store: rm removes objects and rows (its empty folders too), says which keys were not stored, leaves a hand-changed file and another account's same key; token delete asks, then keeps or deletes the objects, and the name can be given again"
    )
    func localStore() async throws {
        let relay = try await CommandLineTests.DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        let binary = try relayBinary()
        let (data, port, ca) = (relay.data, relay.port, relay.data + "/dev/ca.pem")
        let token = relay.environment["UPLOAD_TOKEN"]!
        let a = makeFile(source, "a.jpg", size: 10_000, seed: 1)
        _ = makeFile(source + "/trip", "b.jpg", size: 20_000, seed: 2)
        let c = makeFile(source, "c.jpg", size: 30_000, seed: 3)
        await #expect(try Self.send([a.path, source + "/trip", c.path], token: token, port: port, ca: ca) == 0)
        let other = try await CommandLineTests.run(binary, ["token", "add", "other", "--data", data]).stdout.trimmingCharacters(
            in: .whitespacesAndNewlines)
        await #expect(try Self.send([a.path], token: other, port: port, ca: ca) == 0)
        let store = data + "/store"
        #expect(FileManager.default.fileExists(atPath: store + "/dev/trip/b.jpg") && FileManager.default.fileExists(atPath: store + "/other/a.jpg"))

        let removed = try await CommandLineTests.run(binary, ["rm", "--json", "--data", data, "--account", "dev", "a.jpg", "trip/b.jpg", "nope.jpg"])
        #expect(removed.status == 1, "nope.jpg was not stored: exit 1; \(removed.stderr)")
        let lines = try CommandLineTests.jsonLines(removed.stdout)
        #expect(lines.map { $0["status"] as? String } == ["removed", "removed", "not_stored"], "\(lines)")
        #expect(lines.first?["bytes"] as? Int == 10_000)
        #expect(!FileManager.default.fileExists(atPath: store + "/dev/a.jpg"))
        #expect(!FileManager.default.fileExists(atPath: store + "/dev/trip"), "the key's empty folder stayed")
        #expect(FileManager.default.contents(atPath: store + "/other/a.jpg") == a.data, "another account's same key was touched")
        let listed = try await CommandLineTests.run(binary, ["ls", "--json", "--data", data, "--account", "dev"]).stdout
        #expect(!listed.contains("\"a.jpg\"") && !listed.contains("trip/b.jpg") && listed.contains("c.jpg"), "\(listed)")

        // A file changed by hand is not what the relay committed: left as it is.
        try Data("changed by hand".utf8).write(to: URL(fileURLWithPath: store + "/dev/c.jpg"))
        let changed = try await CommandLineTests.run(binary, ["rm", "--data", data, "--account", "dev", "c.jpg"])
        #expect(changed.status == 1 && changed.stdout.contains("left") && changed.stdout.contains("changed by hand"), "\(changed.stdout)")
        #expect(FileManager.default.contents(atPath: store + "/dev/c.jpg") == Data("changed by hand".utf8))

        // token delete asks what happens to the objects, and changes nothing until told.
        let asked = try await CommandLineTests.run(binary, ["token", "delete", "other", "--data", data])
        #expect(asked.status == 2 && asked.stderr.contains("1 objects") && asked.stderr.contains("--delete-objects"), "\(asked.stderr)")
        #expect(FileManager.default.fileExists(atPath: store + "/other/a.jpg"))
        let deleted = try await CommandLineTests.run(binary, ["token", "delete", "other", "--delete-objects", "--data", data])
        #expect(deleted.status == 0 && deleted.stderr.contains("1 objects removed"), "\(deleted.stderr)")
        #expect(!FileManager.default.fileExists(atPath: store + "/other/a.jpg"))
        await #expect(try Self.send([a.path], token: other, port: port, ca: ca) == 3, "the deleted account's token still works")
        // Kept: the files stay, the catalog forgets them, the name is free again.
        let kept = try await CommandLineTests.run(binary, ["token", "delete", "dev", "--keep-objects", "--data", data])
        #expect(kept.status == 0 && kept.stderr.contains("1 objects left in the store"), "\(kept.stderr)")
        #expect(FileManager.default.fileExists(atPath: store + "/dev/c.jpg"))
        let accounts = try await CommandLineTests.run(binary, ["token", "list", "--json", "--data", data]).stdout
        #expect(!accounts.contains("\"dev\"") && !accounts.contains("\"other\""), "\(accounts)")
        await #expect(try CommandLineTests.run(binary, ["token", "add", "other", "--data", data]).status == 0, "the name could not be given again")
    }

    @Test(
        "PostgreSQL and an S3 bucket: rm deletes the S3 object and the row; another writer's object under the same prefix is never touched; token delete --delete-objects empties the account"
    )
    func sharedCatalogAndBucket() async throws {
        let server = try S3TestServer()
        let binary = try relayBinary()
        try await S3TestServer.withBucket { client, bucket in
            try await PostgresTestDatabase.with { catalogURL in
                let data = TestRelay.makeDirectory()
                let source = TestRelay.makeDirectory()
                defer {
                    try? FileManager.default.removeItem(atPath: data)
                    try? FileManager.default.removeItem(atPath: source)
                }
                var environment = ProcessInfo.processInfo.environment
                environment["AWS_ACCESS_KEY_ID"] = server.credentials.accessKeyID
                environment["AWS_SECRET_ACCESS_KEY"] = server.credentials.secretAccessKey
                environment["UPLOAD_RELAY_CATALOG"] = catalogURL
                let storeOptions = ["--store", "s3://\(bucket)/relay", "--s3-endpoint", server.endpoint.url.absoluteString]
                let relay = try ChildProcess(
                    binary,
                    ["serve", "--dev", "--data", data, "--listen", "127.0.0.1:0", "--ready-file", data + "/ready", "--log-level", "warning"]
                        + storeOptions,
                    readyFile: data + "/ready", logFile: data + "/relay.log", environment: environment
                )
                defer {
                    relay.kill(SIGTERM)
                    _ = relay.waitForExit()
                }
                let port = try await relay.waitUntilReady()
                let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
                let x = makeFile(source, "x.mov", size: 200_000, seed: 7)
                let y = makeFile(source, "y.mov", size: 300_000, seed: 8)
                await #expect(try Self.send([x.path, y.path], token: token, port: port, ca: data + "/dev/ca.pem") == 0)
                // Another writer's object where the relay would put one of its own: not the relay's.
                _ = try await client.putObject(bucket: bucket, key: "relay/dev/foreign.bin", body: ByteBuffer(string: "someone else's"))
                let removed = try await CommandLineTests.run(
                    binary, ["rm", "--data", data, "--account", "dev", "x.mov", "foreign.bin"] + storeOptions, environment: environment
                )
                #expect(removed.status == 1, "\(removed.stdout) \(removed.stderr)")
                #expect(removed.stdout.contains("removed     x.mov") && removed.stdout.contains("not stored  foreign.bin"), "\(removed.stdout)")
                #expect(try await client.headObject(bucket: bucket, key: "relay/dev/x.mov") == nil)
                #expect(try await client.headObject(bucket: bucket, key: "relay/dev/foreign.bin") != nil, "another writer's object was removed")
                let deleted = try await CommandLineTests.run(
                    binary, ["token", "delete", "dev", "--delete-objects", "--data", data] + storeOptions, environment: environment
                )
                #expect(deleted.status == 0 && deleted.stderr.contains("1 objects removed"), "\(deleted.stderr)")
                #expect(try await client.headObject(bucket: bucket, key: "relay/dev/y.mov") == nil)
                #expect(try await client.headObject(bucket: bucket, key: "relay/dev/foreign.bin") != nil)
                let accounts = try await CommandLineTests.run(binary, ["token", "list", "--json", "--data", data], environment: environment).stdout
                #expect(!accounts.contains("\"dev\""), "\(accounts)")
            }
        }
    }
}
