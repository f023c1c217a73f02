import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Testing
import UploadAgent
import UploadChecksums
import UploadRelay
import UploadTestSupport

/// The HTTPS status endpoint (issue 10, "in progress" visible to others): an app polls it with its account's token
/// while agents upload, on SQLite and on a PostgreSQL catalog that several relays share; bad requests and hostile
/// peers get an answer that says why, or a closed connection, and uploads go on.
@Suite("End to end: the status endpoint")
struct StatusEndpointTests {
    /// A relay with a status endpoint on a free port, quick to acknowledge (so an upload shows its bytes early).
    static func relay(catalogURL: String? = nil, directory: String? = nil, requestTimeout: Duration = .seconds(30)) async throws -> TestRelay {
        try await TestRelay(directory: directory, catalogURL: catalogURL) { configuration in
            var endpoint = StatusEndpoint(host: "127.0.0.1", port: 0)
            endpoint.maxConnections = 8
            endpoint.requestTimeout = requestTimeout
            endpoint.maxListed = 20
            configuration.status = endpoint
            configuration.syncBytes = 64 << 10
            configuration.syncInterval = .milliseconds(50)
        }
    }

    /// Runs `body` with a client of the endpoint's CA, shut down on every path: a client left running crashes the test
    /// process at its deinit, and with it every test under way.
    static func withClient<T>(ca: String, _ body: (HTTPClient) async throws -> T) async throws -> T {
        let client = Self.client(ca: ca)
        do {
            let value = try await body(client)
            try await client.shutdown()
            return value
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    /// An HTTPS client that trusts the relay's dev CA.
    static func client(ca: String) -> HTTPClient {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .file(ca)
        var configuration = HTTPClient.Configuration(tlsConfiguration: tls)
        configuration.timeout = .init(connect: .seconds(10), read: .seconds(20))
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    struct Answer {
        var status: Int
        var headers: [(String, String)]
        var json: [String: Any]

        func header(_ name: String) -> String? { self.headers.first { $0.0.lowercased() == name }?.1 }
    }

    /// GET (or `method`) `query` of /v1/status on `port` with `token`.
    static func get(_ client: HTTPClient, port: Int, _ query: String, token: String?, method: HTTPMethod = .GET) async throws -> Answer {
        var request = HTTPClientRequest(url: "https://localhost:\(port)/v1/status\(query.isEmpty ? "" : "?" + query)")
        request.method = method
        if let token { request.headers.add(name: "authorization", value: "Bearer \(token)") }
        let response = try await client.execute(request, timeout: .seconds(20))
        let body = try await response.body.collect(upTo: 1 << 20)
        let json = (try? JSONSerialization.jsonObject(with: Data(body.readableBytesView))) as? [String: Any] ?? [:]
        return Answer(status: Int(response.status.code), headers: response.headers.map { ($0.name, $0.value) }, json: json)
    }

    static func percentEncoded(_ key: String) -> String {
        key.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "/-._~"))) ?? key
    }

    /// Polls `key` until `condition` holds for its answer (or 30 s pass); the last answer.
    static func poll(_ client: HTTPClient, port: Int, key: String, token: String, until condition: @escaping (Answer) -> Bool) async throws -> Answer?
    {
        var last: Answer? = nil
        _ = try await Polling.eventually(timeout: 30) {
            let answer = try await Self.get(client, port: port, "key=" + Self.percentEncoded(key), token: token)
            last = answer
            return condition(answer)
        }
        return last
    }

    /// Uploads a 3 MiB video through `relay` while an app asks `statusPort` with the same token: it must see the upload
    /// under way (its durable bytes, its size), when `underway` runs, and then stored with its SHA-1. The source stalls
    /// at 1 MiB until the app has seen it under way, so no load on the machine can make the upload end first.
    static func watchedUpload(
        through relay: TestRelay, askingAt statusPort: Int, client: HTTPClient, underway: () async throws -> Void = {}
    ) async throws {
        let size = 3 << 20
        let video = PatternSource(size: size, stallAt: 1 << 20)
        let sending = Task {
            try await upload(
                [UploadItem(key: "videos/clip.mp4", displayPath: "clip.mp4", source: video, dedup: false)],
                port: relay.port, token: relay.token, ca: relay.caPath
            )
        }
        let seen: Answer?
        do {
            seen = try await Self.poll(client, port: statusPort, key: "videos/clip.mp4", token: relay.token) {
                $0.json["status"] as? String == "uploading" && ($0.json["bytes"] as? Int ?? 0) > 0
            }
            #expect(seen?.json["status"] as? String == "uploading", "\(String(describing: seen?.json))")
            #expect(seen?.json["size"] as? Int == size)
            #expect((seen?.json["bytes"] as? Int ?? 0) <= 1 << 20)
            try await underway()
        } catch {
            video.release()
            _ = try? await sending.value
            throw error
        }
        video.release()
        let results = try await sending.value
        #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
        let stored = try await Self.poll(client, port: statusPort, key: "videos/clip.mp4", token: relay.token) {
            $0.json["status"] as? String == "stored"
        }
        #expect(stored?.json["bytes"] as? Int == size && stored?.json["sha1"] as? String == SHA1Hex.of(PatternSource.bytes(0..<size)))
    }

    @Test(
        "an upload longer than one sync shows as uploading from its OPEN, with 0 bytes, before any acknowledgement; in ls --in-progress too; a photo committed at once costs no session"
    )
    func uploadingFromOpen() async throws {
        let relay = try await TestRelay { configuration in
            configuration.status = StatusEndpoint(host: "127.0.0.1", port: 0)
            configuration.syncBytes = 1 << 20
            configuration.syncInterval = .seconds(30)
        }.start()
        let client = Self.client(ca: relay.caPath)
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        do {
            // 3 MiB whose source stalls at 512 KiB, under one sync (1 MiB, or 30 s): nothing is acknowledged until the
            // test lets it go on, so the session can only show from its OPEN.
            let video = PatternSource(size: 3 << 20, stallAt: 512 << 10)
            let sending = Task {
                try await upload(
                    [UploadItem(key: "long.mov", displayPath: "long.mov", source: video, dedup: false)],
                    port: relay.port, token: relay.token, ca: relay.caPath
                )
            }
            let first: Answer?
            let sessions: [UploadSession]
            do {
                first = try await Self.poll(client, port: relay.statusPort, key: "long.mov", token: relay.token) { $0.status == 200 }
                // What ls --in-progress reads: the session.
                sessions = try await relay.parts.catalog.sessions(updatedBefore: .distantFuture)
            } catch {
                video.release()
                _ = try? await sending.value
                throw error
            }
            video.release()
            #expect(first?.json["status"] as? String == "uploading", "\(String(describing: first?.json))")
            #expect(first?.json["bytes"] as? Int == 0, "first seen with \(String(describing: first?.json["bytes"])) bytes: not from its OPEN")
            #expect(first?.json["size"] as? Int == 3 << 20)
            #expect(sessions.map(\.key) == ["long.mov"], "\(sessions)")
            #expect(try await sending.value.first?.status == .stored)
            // A photo under one sync: committed at once, never recorded as a session (no catalog write before its commit).
            let photo = makeFile(source, "p.jpg", size: 200_000, seed: 22)
            _ = try await upload(
                [UploadItem(key: "p.jpg", displayPath: photo.path, source: FileSource(path: photo.path))], port: relay.port, token: relay.token,
                ca: relay.caPath
            )
            #expect(try await relay.parts.catalog.sessions(updatedBefore: .distantFuture).isEmpty)

            // An agent killed after its OPEN, before anything was durable: its session goes with its connection (it
            // would otherwise show as uploading, 0 bytes, until the expiry).
            let dropped = makeFile(source, "dropped.mov", size: 3 << 20, seed: 23)
            let agent = try AgentProcess(
                ["send", "--no-state", "--bwlimit", "128K", dropped.path], environment: AgentProcess.environment(relay, state: source + "/state"),
                log: source + "/agent.log"
            )
            defer { agent.stop(SIGKILL) }
            #expect(
                try await Polling.eventually(timeout: 30) {
                    try await relay.parts.catalog.session(account: "dev", key: "dropped.mov")?.durableOffset == 0
                }, "the OPEN was never recorded: \(agent.child.log)"
            )
            agent.stop(SIGKILL)
            #expect(
                try await Polling.eventually(timeout: 30) { try await relay.parts.catalog.session(account: "dev", key: "dropped.mov") == nil },
                "the session of an OPEN with nothing durable stayed after its connection went"
            )
        } catch {
            try? await client.shutdown()
            await relay.stop()
            throw error
        }
        try await client.shutdown()
        await relay.stop()
    }

    @Test(
        "SQLite: an upload under way shows its durable bytes and size, then stored with its SHA-1; two accounts with the same keys see their own; listings page; bad tokens, revoked tokens and bad requests refused with the reason"
    )
    func sqlite() async throws {
        let relay = try await Self.relay().start()
        try await Self.withClient(ca: relay.caPath) { (client: HTTPClient) async throws in
            let other = try await relay.addAccount("other")
            let source = TestRelay.makeDirectory()
            defer { try? FileManager.default.removeItem(atPath: source) }

            // The same key for both accounts, different bytes.
            let mine = makeFile(source, "mine.jpg", size: 100_000, seed: 1)
            let theirs = makeFile(source, "theirs.jpg", size: 200_000, seed: 2)
            _ = try await upload(
                [UploadItem(key: "photos/a b+c.jpg", displayPath: mine.path, source: FileSource(path: mine.path))], port: relay.port,
                token: relay.token,
                ca: relay.caPath)
            _ = try await upload(
                [UploadItem(key: "photos/a b+c.jpg", displayPath: theirs.path, source: FileSource(path: theirs.path))], port: relay.port,
                token: other,
                ca: relay.caPath)
            let a = try await Self.get(client, port: relay.statusPort, "key=photos/a%20b%2Bc.jpg", token: relay.token)
            #expect(a.status == 200)
            #expect(a.json["status"] as? String == "stored" && a.json["bytes"] as? Int == 100_000 && a.json["size"] as? Int == 100_000)
            #expect(a.json["sha1"] as? String == SHA1Hex.of(mine.data))
            #expect(a.header("cache-control") == "no-store")
            let b = try await Self.get(client, port: relay.statusPort, "key=photos/a%20b%2Bc.jpg", token: other)
            #expect(b.json["size"] as? Int == 200_000 && b.json["sha1"] as? String == SHA1Hex.of(theirs.data))

            // A video sent at 512 KiB/s: an app polling sees it under way, then stored; the listing too; another account never.
            try await Self.watchedUpload(through: relay, askingAt: relay.statusPort, client: client) {
                let listing = try await Self.get(client, port: relay.statusPort, "prefix=videos/", token: relay.token)
                let entries = listing.json["entries"] as? [[String: Any]] ?? []
                let listed: [String] = entries.compactMap { $0["key"] as? String }
                let listedStatus = entries.first?["status"] as? String
                #expect(listed == ["videos/clip.mp4"])
                #expect(listedStatus == "uploading")
                #expect(try await Self.get(client, port: relay.statusPort, "key=videos/clip.mp4", token: other).status == 404)
                #expect((try await Self.get(client, port: relay.statusPort, "", token: other).json["entries"] as? [Any])?.count == 1)
            }

            // Pages: 25 photos, 20 a page at most.
            var items: [UploadItem] = []
            for index in 0..<25 {
                let file = makeFile(source, "p\(index)", size: 1000 + index, seed: UInt64(10 + index))
                items.append(UploadItem(key: String(format: "album/%02d.jpg", index), displayPath: file.path, source: FileSource(path: file.path)))
            }
            _ = try await upload(items, port: relay.port, token: relay.token, ca: relay.caPath)
            let first = try await Self.get(client, port: relay.statusPort, "prefix=album/&limit=20", token: relay.token)
            let next = try #require(first.json["next"] as? String)
            let second = try await Self.get(client, port: relay.statusPort, "prefix=album/&after=" + Self.percentEncoded(next), token: relay.token)
            let keys = ((first.json["entries"] as? [[String: Any]] ?? []) + (second.json["entries"] as? [[String: Any]] ?? [])).compactMap {
                $0["key"] as? String
            }
            #expect(keys == (0..<25).map { String(format: "album/%02d.jpg", $0) })
            #expect(second.json["next"] == nil)

            // Refusals: each with its status and a reason.
            let noToken = try await Self.get(client, port: relay.statusPort, "key=x", token: nil)
            #expect(noToken.status == 401 && noToken.header("www-authenticate")?.hasPrefix("Bearer") == true)
            #expect(try await Self.get(client, port: relay.statusPort, "key=x", token: "upl_not-a-token").status == 401)
            let traversal = try await Self.get(client, port: relay.statusPort, "key=../../etc/passwd", token: relay.token)
            #expect(traversal.status == 400 && (traversal.json["error"] as? String ?? "").contains(".."))
            #expect(try await Self.get(client, port: relay.statusPort, "limit=21", token: relay.token).status == 400)
            let post = try await Self.get(client, port: relay.statusPort, "key=x", token: relay.token, method: .POST)
            #expect(post.status == 405 && post.header("allow") == "GET, HEAD")
            let head = try await Self.get(client, port: relay.statusPort, "key=videos/clip.mp4", token: relay.token, method: .HEAD)
            #expect(head.status == 200 && head.json.isEmpty)
            _ = try await relay.parts.catalog.revokeAccount(named: "other")
            let revoked = try await Self.get(client, port: relay.statusPort, "key=photos/a%20b%2Bc.jpg", token: other)
            #expect(revoked.status == 401 && (revoked.json["error"] as? String ?? "").contains("revoked"))

        }
        await relay.stop()
    }

    @Test(
        "hostile peers: garbage, a body, pipelined requests, silence, plain HTTP and a flood of connections get an answer or a closed connection; uploads go on"
    )
    func hostile() async throws {
        // A request timeout short enough to wait for, long enough for a TLS handshake and an answer on a loaded machine.
        let relay = try await Self.relay(requestTimeout: .seconds(8)).start()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let port = relay.statusPort
        let ca = relay.caPath

        let garbage = try await RawTLS.exchange(Array("\u{1}\u{2}NOT HTTP AT ALL\r\n\r\n".utf8), port: port, ca: ca, group: group)
        #expect(garbage.hasPrefix("HTTP/1.1 400"), "\(garbage)")
        let body = try await RawTLS.exchange(
            Array("GET /v1/status?key=x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(relay.token)\r\nContent-Length: 100000\r\n\r\n".utf8)
                + Array(repeating: 0x41, count: 100_000),
            port: port, ca: ca, group: group
        )
        #expect(body.hasPrefix("HTTP/1.1 413"), "\(body.prefix(200))")
        let huge = try await RawTLS.exchange(
            Array("GET /v1/status?key=\(String(repeating: "a", count: 200_000)) HTTP/1.1\r\nHost: x\r\n\r\n".utf8), port: port, ca: ca, group: group)
        #expect(huge.hasPrefix("HTTP/1.1 4"), "\(huge.prefix(200))")
        // Two requests in one write: two answers, in order; the connection then closes after the timeout.
        let pipelined = try await RawTLS.exchange(
            Array(
                "GET /v1/status?key=nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(relay.token)\r\n\r\nGET /v1/status?limit=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(relay.token)\r\n\r\n"
                    .utf8),
            port: port, ca: ca, group: group
        )
        // A body ends with no line break: the next answer's status line follows it on the same line.
        let statuses = pipelined.components(separatedBy: "HTTP/1.1 ").dropFirst().map {
            "HTTP/1.1 " + ($0.components(separatedBy: "\r\n").first ?? "")
        }
        #expect(statuses == ["HTTP/1.1 404 Not Found", "HTTP/1.1 200 OK"], "\(pipelined)")
        // CONNECT and Upgrade: refused, and what follows is not kept (the codec reads nothing after them).
        for ask in [
            "CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /v1/status?key=x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        ] {
            let switched = try await RawTLS.exchange(Array(ask.utf8) + Array(repeating: 0x41, count: 1 << 20), port: port, ca: ca, group: group)
            #expect(switched.hasPrefix("HTTP/1.1 400") && switched.contains("no CONNECT, no Upgrade"), "\(switched.prefix(300))")
        }
        // Silence after the handshake, and a request that trickles in: both closed after the request timeout (8 s).
        #expect(try await RawTLS.exchange([], port: port, ca: ca, group: group).isEmpty)
        #expect(try await RawTLS.exchange(Array("GET /v1/sta".utf8), port: port, ca: ca, group: group).isEmpty)
        // Plain HTTP to the TLS port: no answer in clear text.
        let plain = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        try? await plain.writeAndFlush(ByteBuffer(string: "GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"))
        try await plain.closeFuture.get()

        // More connections than the endpoint takes (8): the rest are closed at once. On a relay of its own whose request
        // timeout (30 s) cannot free a place while the test connects.
        let crowded = try await Self.relay().start()
        var silent: [any Channel] = []
        for _ in 0..<8 {
            silent.append(try await SilentPeer.connect(port: crowded.statusPort, ca: crowded.caPath, group: group, alpn: RelayStatusServer.alpn))
        }
        await #expect(throws: (any Error).self) {
            _ = try await SilentPeer.connect(port: crowded.statusPort, ca: crowded.caPath, group: group, alpn: RelayStatusServer.alpn)
        }
        for channel in silent { try? await channel.close() }
        await crowded.stop()

        // The relay still uploads, and the endpoint still answers.
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        let file = makeFile(source, "after.jpg", size: 50_000, seed: 9)
        let results = try await upload(
            [UploadItem(key: "after.jpg", displayPath: file.path, source: FileSource(path: file.path))], port: relay.port, token: relay.token, ca: ca)
        #expect(results.first?.status == .stored)
        try await Self.withClient(ca: ca) { (client: HTTPClient) async throws in
            #expect(try await Self.get(client, port: port, "key=after.jpg", token: relay.token).json["status"] as? String == "stored")
        }
        try await group.shutdownGracefully()
        await relay.stop()
    }

    @Test("a client that pipelines requests and never reads is cut off past the bound; reading stops meanwhile; others are answered")
    func pipeliningWithoutReading() async throws {
        // A long request timeout: only the pipelining bound can end this connection within the test's wait.
        let relay = try await Self.relay(requestTimeout: .seconds(120)).start()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel = try await SilentPeer.connect(port: relay.statusPort, ca: relay.caPath, group: group, alpn: RelayStatusServer.alpn)
        // Never read again: the answers pile up on the relay's side, unless it stops answering.
        _ = channel.setOption(.autoRead, value: false)
        let request = "GET /v1/status?prefix=a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(relay.token)\r\n\r\n"
        let ahead = 2_000
        #expect(ahead > StatusEndpoint(host: "", port: 0).maxPipelinedRequests)
        try? await channel.writeAndFlush(ByteBuffer(string: String(repeating: request, count: ahead)))
        let closed = try await Polling.eventually(timeout: 20) { !channel.isActive }
        #expect(closed, "the relay kept a connection open that sent \(ahead) requests ahead and read none of the answers")
        try? await channel.close()
        // The endpoint still answers a client that reads.
        try await Self.withClient(ca: relay.caPath) { (client: HTTPClient) async throws in
            #expect(try await Self.get(client, port: relay.statusPort, "prefix=a", token: relay.token).status == 200)
        }
        try await group.shutdownGracefully()
        await relay.stop()
    }

    @Test("PostgreSQL, two relays: an upload through relay A shows under way, then stored, on relay B's endpoint")
    func postgresAcrossRelays() async throws {
        try await PostgresTestDatabase.with { url in
            let a = try await Self.relay(catalogURL: url).start()
            // B has a data directory of its own, with A's dev certificates and token (the account is in the shared catalog).
            let directoryB = TestRelay.makeDirectory()
            try FileManager.default.copyItem(atPath: a.directory + "/dev", toPath: directoryB + "/dev")
            let b = try await Self.relay(catalogURL: url, directory: directoryB).start()
            #expect(a.token == b.token)
            try await Self.withClient(ca: b.caPath) { (client: HTTPClient) async throws in
                try await Self.watchedUpload(through: a, askingAt: b.statusPort, client: client)
                let listing = try await Self.get(client, port: b.statusPort, "prefix=videos/", token: b.token)
                #expect((listing.json["entries"] as? [[String: Any]])?.first?["bytes"] as? Int == 3 << 20)
            }
            await b.stop()
            await a.stop()
        }
    }
}

/// A TLS client that writes bytes and reads whatever comes back until the server closes.
enum RawTLS {
    static func context(ca: String) throws -> NIOSSLContext {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .file(ca)
        tls.applicationProtocols = [RelayStatusServer.alpn]
        return try NIOSSLContext(configuration: tls)
    }

    /// Sends `bytes` over a new TLS connection; everything the server answered, once it closed.
    static func exchange(_ bytes: [UInt8], port: Int, ca: String, group: any EventLoopGroup) async throws -> String {
        let context = try Self.context(ca: ca)
        let collected = group.next().makePromise(of: [UInt8].self)
        let channel = try await ClientBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: "localhost"))
                    try channel.pipeline.syncOperations.addHandler(Collector(promise: collected))
                }
            }
            .connect(host: "127.0.0.1", port: port)
            .get()
        if !bytes.isEmpty {
            // The server may close first (a refusal, a timeout): what it answered is the outcome, not the write's error.
            try? await channel.writeAndFlush(ByteBuffer(bytes: bytes))
        }
        return String(decoding: try await collected.futureResult.get(), as: UTF8.self)
    }

    final class Collector: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let promise: EventLoopPromise<[UInt8]>
        var bytes: [UInt8] = []
        init(promise: EventLoopPromise<[UInt8]>) { self.promise = promise }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            self.bytes += Array(self.unwrapInboundIn(data).readableBytesView)
        }

        func channelInactive(context: ChannelHandlerContext) {
            self.promise.succeed(self.bytes)
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            // An unclean TLS shutdown after the answer still counts as the end.
            context.close(promise: nil)
        }
    }
}
