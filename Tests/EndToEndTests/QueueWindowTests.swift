import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOPosix
import Testing
import UploadTestSupport

@testable import UploadAgent
import NIOCore

/// A persistent queue much longer than the jobs it holds in memory: the rest wait in the state database and come in
/// as uploads end. Real relay over TLS in this process.
@Suite("End to end: a queue longer than its window", .serialized)
struct QueueWindowTests {
    @Test("300 files through a window of 16: every one stored, in about the order queued, never more than 16 in memory")
    func windowed() async throws {
        let relay = try await TestRelay().start()
        let home = TestRelay.makeDirectory()
        var configuration = AgentConfiguration(relayHost: "127.0.0.1", relayPort: relay.port, token: relay.token, caPath: relay.caPath)
        configuration.queueWindow = 16
        configuration.concurrency = 3
        var expected: [String: Data] = [:]
        var items: [UploadItem] = []
        for i in 0..<300 {
            let name = "IMG_\(1000 + i).jpg"
            let file = makeFile(home + "/DCIM", name, size: 2_000 + i * 13, seed: UInt64(i))
            expected["DCIM/" + name] = file.data
            items.append(UploadItem(key: "DCIM/" + name, displayPath: file.path, source: FileSource(path: file.path)))
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        var logger = Logger(label: "test-agent")
        logger.logLevel = .warning
        let store = try AgentStateStore(directory: home + "/state")
        let lock = try #require(try RunnerLock.tryAcquire(store: store, target: AgentStateStore.target(of: configuration)))
        let runner = QueueRunner(
            uploader: Uploader(configuration: configuration, group: group, logger: logger), store: store, lock: lock, keepResults: true
        )
        try runner.loadPending()
        try runner.enqueue(items, skipUnchanged: false)
        #expect(runner.heldJobs == 16)
        #expect(try store.pending(target: AgentStateStore.target(of: configuration)).count == 300, "every file recorded before a byte moves")
        let most = NIOLockedValueBox(0)
        let started = NIOLockedValueBox<[String]>([])
        try await runner.run(service: false) { event in
            most.withLockedValue { $0 = max($0, runner.heldJobs) }
            if case .started(let key, _, _) = event { started.withLockedValue { $0.append(key) } }
        }
        try await group.shutdownGracefully()
        #expect(most.withLockedValue { $0 } <= 16)
        // The send did not end with rows still waiting in the database.
        #expect(runner.results.count == 300)
        #expect(runner.results.allSatisfy { $0.status == .stored }, "\(runner.results.filter { $0.status != .stored })")
        #expect(try store.pending(target: AgentStateStore.target(of: configuration)).isEmpty)
        for (key, data) in expected { #expect(relay.stored(key) == data, "\(key)") }
        // First in, first out, give or take what one window lets run side by side.
        let order = started.withLockedValue { $0 }
        let queued = items.map(\.key)
        for (position, key) in order.enumerated() {
            let index = queued.firstIndex(of: key) ?? -1000
            #expect(abs(index - position) <= 16, "\(key) started \(position)th but was queued \(index)th")
        }
        await relay.stop()
    }
}
