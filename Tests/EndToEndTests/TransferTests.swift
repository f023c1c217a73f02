import Foundation
import Testing
@_spi(Testing) @testable import UploadAgent
import UploadChecksums
import UploadProtocol
import UploadRelay
import UploadTestSupport

/// Uploads over real TLS on 127.0.0.1: agent library against a relay server in this process.
@Suite("End to end: transfers", .serialized)
struct TransferTests {
    @Test("0 B, 1 B, one chunk, one chunk + 1 and 100 MiB land byte-identical in the store")
    func sizes() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let chunk = 1 << 20
        let sizes = [("zero", 0), ("one", 1), ("chunk", chunk), ("chunk-plus-one", chunk + 1), ("big", 100 << 20)]
        var files: [String: Data] = [:]
        var items: [UploadItem] = []
        for (index, (name, size)) in sizes.enumerated() {
            let file = makeFile(source, name, size: size, seed: UInt64(index + 1))
            files[name] = file.data
            items.append(UploadItem(key: "sizes/\(name)", displayPath: file.path, source: FileSource(path: file.path)))
        }
        let results = try await upload(items, port: relay.port, token: relay.token, ca: relay.caPath)
        #expect(results.count == sizes.count)
        for result in results {
            #expect(result.status == .stored, "\(result.key): \(result.error ?? "")")
            let name = String(result.key.dropFirst("sizes/".count))
            #expect(relay.stored(result.key) == files[name], "\(result.key) differs")
            #expect(result.sha1 == SHA1.hash(files[name]!).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined())
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: relay.parts.configuration.stagingDirectory).isEmpty)
        #expect(relay.parts.space.promised == 0, "\(relay.parts.space.promised) bytes still promised")
        await relay.stop()
    }

    @Test("a directory of 1,000 small files goes over one connection")
    func thousandFiles() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        for i in 0..<1000 {
            _ = makeFile(source + "/album", "img-\(i).jpg", size: 100 + i, seed: UInt64(i))
        }
        let items = try ItemPlanner.plan(paths: [source + "/album"], prefix: nil, stdinName: nil).items
        #expect(items.count == 1000)
        let connections = Counter()
        let results = try await upload(
            items, port: relay.port, token: relay.token, ca: relay.caPath,
            onEvent: { event in
                if case .connected = event { connections.increment() }
            })
        #expect(results.filter { $0.status == .stored }.count == 1000)
        #expect(connections.value == 1)
        #expect(relay.stored("album/img-999.jpg")?.count == 1099)
        await relay.stop()
    }

    @Test("--connections 3: 30 files of 1 MiB go over three connections sharing --concurrency 6; every object exact")
    func severalConnections() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        var files: [String: Data] = [:]
        for i in 0..<30 {
            files["clips/c\(i).bin"] = makeFile(source + "/clips", "c\(i).bin", size: (1 << 20) + i, seed: UInt64(500 + i)).data
        }
        let items = try ItemPlanner.plan(paths: [source + "/clips"], prefix: nil, stdinName: nil).items
        let connections = Counter()
        let results = try await upload(
            items, port: relay.port, token: relay.token, ca: relay.caPath,
            configure: {
                $0.connections = 3
                $0.adaptiveConnections = false
                $0.concurrency = 6
            },
            onEvent: { event in
                if case .connected = event { connections.increment() }
            }
        )
        #expect(results.count == 30 && results.allSatisfy { $0.status == .stored }, "\(results.filter { $0.status != .stored })")
        #expect(
            connections.value == 3 && relay.server.connectionsAdmitted == 3,
            "\(connections.value) connected, \(relay.server.connectionsAdmitted) admitted")
        for (key, data) in files { #expect(relay.stored(key) == data, "\(key)") }
        await relay.stop()
    }

    @Test(
        "adaptive connections: on loopback the run keeps one; told the link's round trip is 50 ms, it opens more while stripes wait, and the 100 MiB file goes in 7 stripes; every object exact"
    )
    func adaptiveConnections() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let big = makeFile(source + "/a", "long.mp4", size: 100 << 20, seed: 91).data
        let items = try ItemPlanner.plan(paths: [source + "/a"], prefix: nil, stdinName: nil).items
        for assumed in [nil, Duration.milliseconds(50)] {
            let connections = Counter()
            let said = Counter()
            let results = try await upload(
                items, port: relay.port, token: relay.token, ca: relay.caPath,
                configure: {
                    $0.concurrency = 2
                    $0.overwrite = true
                    $0.dedup = false
                    // Two seconds at least: the first decision, a quarter of a second in, finds stripes waiting.
                    $0.bandwidthLimit = 50 << 20
                    $0.faults.assumedRoundTrip = assumed
                },
                onEvent: { event in
                    if case .connected = event { connections.increment() }
                    if case .connections = event { said.increment() }
                }
            )
            #expect(results.count == 1 && results[0].status == .stored, "\(results.map { $0.error ?? "" })")
            #expect(relay.stored("a/long.mp4") == big)
            if assumed == nil {
                #expect(connections.value == 1 && said.value == 0, "\(connections.value) connections on loopback")
                #expect(results.first?.stripes == 1)
            } else {
                #expect(connections.value >= 2 && said.value >= 1, "\(connections.value) connections, \(said.value) said")
                #expect(results.first?.stripes == 7)
            }
        }
        await relay.stop()
    }

    @Test("--connections 3: a 50 MiB file goes in 4 stripes over the connections, the 5 MiB one beside it whole; both exact")
    func stripedFile() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let big = makeFile(source + "/v", "long.mp4", size: 50 << 20, seed: 77).data
        let small = makeFile(source + "/v", "short.mp4", size: 5 << 20, seed: 78).data
        let items = try ItemPlanner.plan(paths: [source + "/v"], prefix: nil, stdinName: nil).items
        let results = try await upload(
            items, port: relay.port, token: relay.token, ca: relay.caPath,
            configure: {
                $0.connections = 3
                $0.adaptiveConnections = false
                $0.concurrency = 6
            }
        )
        let byKey = Dictionary(uniqueKeysWithValues: results.map { ($0.key, $0) })
        #expect(results.count == 2 && results.allSatisfy { $0.status == .stored }, "\(results.map { $0.error ?? "" })")
        #expect(byKey["v/long.mp4"]?.stripes == 4)
        #expect(byKey["v/long.mp4"]?.sentBytes == UInt64(50 << 20))
        #expect(byKey["v/short.mp4"]?.stripes == 1)
        #expect(relay.stored("v/long.mp4") == big)
        #expect(relay.stored("v/short.mp4") == small)
        // Committed: no disk space stays promised to them (a striped upload's main stream writes one stripe only).
        #expect(relay.parts.space.promised == 0, "\(relay.parts.space.promised) bytes still promised")
        await relay.stop()
    }

    @Test(
        "large videos and photos at once, --connections 2, a relay allowing 2 streams per connection: every video striped, every file exact, no wait for stripes that cannot open"
    )
    func videosAndPhotosStriped() async throws {
        let relay = try await TestRelay { $0.limits.maxConcurrentStreams = 2 }.start()
        let source = TestRelay.makeDirectory()
        var files: [String: Data] = [:]
        for i in 0..<3 {
            files["gallery/v\(i).mp4"] = makeFile(source + "/gallery", "v\(i).mp4", size: (20 << 20) + i, seed: UInt64(700 + i)).data
        }
        for i in 0..<60 {
            files["gallery/p\(i).jpg"] = makeFile(source + "/gallery", "p\(i).jpg", size: 30_000 + i, seed: UInt64(800 + i)).data
        }
        let items = try ItemPlanner.plan(paths: [source + "/gallery"], prefix: nil, stdinName: nil).items
        let results = try await upload(
            items, port: relay.port, token: relay.token, ca: relay.caPath,
            configure: {
                $0.connections = 2
                $0.adaptiveConnections = false
                $0.concurrency = 4
            }
        )
        #expect(
            results.count == 63 && results.allSatisfy { $0.status == .stored }, "\(results.filter { $0.status != .stored }.map { $0.error ?? "" })")
        // Striped whatever else runs (a file's striping never depends on scheduling: a resume would discard it).
        let videos = results.filter { $0.key.hasSuffix(".mp4") }
        #expect(videos.count == 3 && videos.allSatisfy { $0.stripes == 2 }, "\(videos.map { "\($0.key): \($0.stripes)" })")
        for (key, data) in files { #expect(relay.stored(key) == data, "\(key)") }
        await relay.stop()
    }

    @Test("--connections 2 against a relay that admits one connection: the refused one waits while the other carries the queue; nothing fails")
    func connectionRefusedWhileOthersProgress() async throws {
        let relay = try await TestRelay { $0.maxConnections = 1 }.start()
        let source = TestRelay.makeDirectory()
        var files: [String: Data] = [:]
        for i in 0..<12 {
            files["slow/s\(i).bin"] = makeFile(source + "/slow", "s\(i).bin", size: 300_000, seed: UInt64(900 + i)).data
        }
        let items = try ItemPlanner.plan(paths: [source + "/slow"], prefix: nil, stdinName: nil).items
        // 3.6 MB at 1 MB/s takes over 3 s: longer than --retry-for, which the refused connection must not give up at.
        let results = try await upload(
            items, port: relay.port, token: relay.token, ca: relay.caPath,
            configure: {
                $0.connections = 2
                $0.adaptiveConnections = false
                $0.concurrency = 4
                $0.bandwidthLimit = 1_000_000
                $0.retryFor = .seconds(1)
                $0.maxBackoff = .milliseconds(200)
            }
        )
        #expect(
            results.count == 12 && results.allSatisfy { $0.status == .stored }, "\(results.filter { $0.status != .stored }.map { $0.error ?? "" })")
        for (key, data) in files { #expect(relay.stored(key) == data, "\(key)") }
        await relay.stop()
    }

    @Test("--connections shares --concurrency, reads in flight and socket buffers: never a connection without a place, never more than asked")
    func connectionShares() async {
        func shares(_ connections: Int, _ concurrency: Int) -> [AgentConfiguration] {
            var configuration = AgentConfiguration(relayHost: "relay", relayPort: 1, token: "t", caPath: nil)
            configuration.connections = connections
            configuration.adaptiveConnections = false
            configuration.concurrency = concurrency
            return Uploader.connectionShares(configuration)
        }
        #expect(shares(1, 5).map(\.concurrency) == [5])
        #expect(shares(3, 5).map(\.concurrency) == [2, 2, 1])
        #expect(shares(4, 8).map(\.concurrency) == [2, 2, 2, 2])
        #expect(shares(8, 5).map(\.concurrency) == [1, 1, 1, 1, 1])
        let defaults = AgentConfiguration(relayHost: "relay", relayPort: 1, token: "t", caPath: nil)
        #expect(shares(1, 5).map(\.maxReadsInFlight) == [defaults.maxReadsInFlight])
        #expect(shares(4, 8).map(\.maxReadsInFlight) == [1, 1, 1, 1], "each connection reads at least once at a time")
        // The bytes waiting for the sockets, together, stay what one connection has (each holds at least a chunk).
        #expect(shares(2, 8).map(\.writeBufferBytes).reduce(0, +) == defaults.writeBufferBytes)
        #expect(shares(4, 8).allSatisfy { $0.writeBufferBytes >= $0.chunkSize })
        #expect(shares(4, 8).map(\.writeBufferBytes).reduce(0, +) == defaults.writeBufferBytes)
        // Chunks shrink with the connections (a connection holds about two), never below 256 KiB, and each TLS buffer
        // keeps its records' room above its chunk.
        #expect(shares(1, 5).map(\.chunkSize) == [defaults.chunkSize])
        #expect(shares(2, 8).map(\.chunkSize) == [512 << 10, 512 << 10])
        #expect(shares(4, 8).map(\.chunkSize) == Array(repeating: 256 << 10, count: 4))
        #expect(shares(8, 8).map(\.chunkSize) == Array(repeating: 256 << 10, count: 8))
        // So do the reads in flight: their batches together are what one connection reads at once.
        let readBytes = defaults.maxReadsInFlight * defaults.readBatchBytes
        #expect(shares(1, 5).map { $0.maxReadsInFlight * $0.readBatchBytes } == [readBytes])
        #expect(shares(2, 8).map { $0.maxReadsInFlight * $0.readBatchBytes }.reduce(0, +) == readBytes)
        #expect(shares(4, 8).map { $0.maxReadsInFlight * $0.readBatchBytes }.reduce(0, +) == readBytes)
        #expect(shares(8, 8).allSatisfy { $0.readBatchBytes == $0.chunkSize }, "a read holds at least a chunk")
        #expect(shares(4, 8).allSatisfy { $0.tlsBufferBytes - $0.chunkSize == defaults.tlsBufferBytes - defaults.chunkSize })
        // Each knows how many run (a large file is striped only when there are others to carry stripes).
        #expect(shares(4, 8).allSatisfy { $0.connections == 4 })
        #expect(shares(8, 5).allSatisfy { $0.connections == 5 })
    }

    @Test("stdin: a stream of unknown length")
    func stdin() async throws {
        let relay = try await TestRelay().start()
        let pipe = Pipe()
        let payload = makeFile(TestRelay.makeDirectory(), "s", size: 3 << 20 + 17, seed: 9).data
        let writer = Thread {
            pipe.fileHandleForWriting.write(payload)
            try? pipe.fileHandleForWriting.close()
        }
        writer.start()
        let source = StreamSource(descriptor: pipe.fileHandleForReading.fileDescriptor, displayName: "stdin")
        let results = try await upload(
            [UploadItem(key: "piped/stream.bin", displayPath: "-", source: source)], port: relay.port, token: relay.token, ca: relay.caPath)
        #expect(results.first?.status == .stored)
        #expect(results.first?.bytes == UInt64(payload.count))
        #expect(relay.stored("piped/stream.bin") == payload)
        await relay.stop()
    }

    @Test("a second run sends nothing: every file is deduplicated by size and SHA-1")
    func dedup() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "photo.jpg", size: 2 << 20, seed: 4)
        let item = { UploadItem(key: "photo.jpg", displayPath: file.path, source: FileSource(path: file.path)) }
        let first = try await upload([item()], port: relay.port, token: relay.token, ca: relay.caPath)
        #expect(first.first?.status == .stored)
        let second = try await upload([item()], port: relay.port, token: relay.token, ca: relay.caPath)
        #expect(second.first?.status == .deduplicated)
        #expect(second.first?.sentBytes == 0)
        // The same bytes under another key are placed by the relay, not sent.
        let copy = try await upload(
            [UploadItem(key: "copy/photo.jpg", displayPath: file.path, source: FileSource(path: file.path))],
            port: relay.port, token: relay.token, ca: relay.caPath
        )
        #expect(copy.first?.status == .deduplicated)
        #expect(relay.stored("copy/photo.jpg") == file.data)
        await relay.stop()
    }

    @Test("deflate, when asked, stores the raw bytes")
    func deflate() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let text = Data(String(repeating: "a log line that repeats itself\n", count: 100_000).utf8)
        #expect(FileManager.default.createFile(atPath: source + "/app.log", contents: text))
        let results = try await upload(
            [UploadItem(key: "logs/app.log", displayPath: "app.log", source: FileSource(path: source + "/app.log"))],
            port: relay.port, token: relay.token, ca: relay.caPath
        )
        #expect(results.first?.status == .stored)
        let compressed = try await upload(
            [UploadItem(key: "logs/app2.log", displayPath: "app.log", source: FileSource(path: source + "/app.log"))],
            port: relay.port, token: relay.token, ca: relay.caPath,
            configure: {
                $0.deflate = true; $0.dedup = false
            }
        )
        #expect(compressed.first?.status == .stored)
        #expect(relay.stored("logs/app2.log") == text)
        await relay.stop()
    }
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    func increment() {
        self.lock.lock()
        self.count += 1
        self.lock.unlock()
    }
    var value: Int {
        self.lock.lock()
        defer { self.lock.unlock() }
        return self.count
    }
}
