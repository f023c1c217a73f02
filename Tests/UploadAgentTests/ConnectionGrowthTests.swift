import Dispatch
import NIOCore
import Testing
import UploadTestSupport

@testable import UploadAgent

/// An adaptive run's decisions: more connections only on a long link, only while each one raised the rate, only when
/// there is work for them, never above the maximum.
@Suite("Adaptive connections")
struct ConnectionGrowthTests {
    /// The decisions of `samples` (round trip, rate, work waiting) in order.
    static func decisions(_ growth: inout ConnectionGrowth, _ samples: [(Duration?, Double, Bool)]) -> [Int] {
        samples.map { growth.sample(roundTrip: $0.0, rate: $0.1, workWaiting: $0.2) }
    }

    @Test("a short round trip (loopback, a LAN) opens no other connection, whatever the rate and the work waiting")
    func shortLink() {
        var growth = ConnectionGrowth(maximum: 8)
        let first = Self.decisions(&growth, [(nil, 0, true)])
        #expect(first == [0] && !growth.settled, "no round trip measured yet: not settled")
        let then = Self.decisions(&growth, [(.microseconds(60), 500e6, true), (.milliseconds(100), 1e6, true)])
        #expect(then == [0, 0], "settled on the short link, and stays settled")
        #expect(growth.settled && growth.running == 1)
    }

    @Test(
        "a long link with work waiting: 4 connections at once, then doubled per window while the ones added raised the rate by 20 % (the first step: over what one connection's send buffer carries per round trip); settled when they did not"
    )
    func longLink() {
        // One connection carries at most 4 MiB per 100 ms: 41.9 MB/s.
        var growth = ConnectionGrowth(maximum: 32, sendBufferLimit: 4 << 20)
        let rtt = Duration.milliseconds(100)
        #expect(Int(growth.oneConnectionCeiling(roundTrip: rtt)) == 41_943_040)
        // The round trip known: 4 at once; 4 -> 110 MB/s (2.6x one connection's most): 8; 8 -> 120 (1.1x): settled.
        let added = Self.decisions(&growth, [(rtt, 0, true), (rtt, 110e6, true), (rtt, 120e6, true), (rtt, 200e6, true)])
        #expect(added == [3, 4, 0, 0])
        #expect(growth.settled && growth.running == 8)
        #expect(growth.reason?.contains("20 %") == true, "\(growth.reason ?? "")")
        // 4 that carry less than 1.2 times one connection's most (50.3 MB/s) did not prove the step paid: no more.
        var capped = ConnectionGrowth(maximum: 32, sendBufferLimit: 4 << 20)
        #expect(Self.decisions(&capped, [(rtt, 0, true), (rtt, 50e6, true)]) == [3, 0])
        #expect(capped.settled && capped.running == 4)
    }

    @Test("a long thin link (a phone's): the first step did not raise the rate past one connection's most, and no more are opened")
    func longThinLink() {
        var growth = ConnectionGrowth(maximum: 8)
        let rtt = Duration.milliseconds(60)
        let added = Self.decisions(&growth, [(rtt, 0, true), (rtt, 1.25e6, true), (rtt, 1.3e6, true)])
        #expect(added == [3, 0, 0])
        #expect(growth.settled && growth.running == 4)
    }

    @Test("no work waiting for a new connection: none opened, asked again; the maximum is never passed")
    func workAndMaximum() {
        var growth = ConnectionGrowth(maximum: 6, sendBufferLimit: 1 << 20)
        let rtt = Duration.milliseconds(40)
        let idle = Self.decisions(&growth, [(rtt, 0, false), (rtt, 10e6, false)])
        #expect(idle == [0, 0] && !growth.settled)
        // One connection's most: 26.2 MB/s; 4 carried 90 MB/s.
        let added = Self.decisions(&growth, [(rtt, 10e6, true), (rtt, 90e6, true), (rtt, 200e6, true)])
        #expect(added == [3, 2, 0], "4 more would pass the maximum of 6: 2")
        #expect(growth.running == 6 && growth.settled)
        var one = ConnectionGrowth(maximum: 1)
        let none = Self.decisions(&one, [(rtt, 0, true)])
        #expect(one.settled && none == [0])
    }

    @Test("connected where the kernel does not tell the round trip: one connection, settled (no polling for ever)")
    func unknownRoundTrip() {
        var growth = ConnectionGrowth(maximum: 8)
        let before = growth.sample(roundTrip: nil, connected: false, rate: 0, workWaiting: true)
        #expect(before == 0 && !growth.settled, "not connected yet: asked again")
        let after = growth.sample(roundTrip: nil, connected: true, rate: 1e6, workWaiting: true)
        #expect(after == 0 && growth.settled && growth.running == 1)
    }

    @Test("a relay on loopback is no long link, whatever the kernel measured (a loaded host's handshake); other addresses are judged by it")
    func loopbackIsShort() throws {
        for text in ["127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"] {
            #expect(AgentConnectionHandler.isLoopback(try SocketAddress(ipAddress: text, port: 7443)), "\(text)")
        }
        for text in ["10.201.0.1", "192.168.1.20", "::ffff:10.0.0.1", "2001:db8::1"] {
            #expect(!AgentConnectionHandler.isLoopback(try SocketAddress(ipAddress: text, port: 7443)), "\(text)")
        }
        #expect(!AgentConnectionHandler.isLoopback(nil))
    }

    @Test("the run's round trip is its first connection's, whatever the later ones measure")
    func runRoundTrip() {
        let meter = LinkMeter()
        #expect(meter.measured(roundTrip: .milliseconds(6)) == .milliseconds(6))
        #expect(meter.measured(roundTrip: .milliseconds(4)) == .milliseconds(6), "a later connection near the threshold decides as the first")
        #expect(meter.connected)
    }

    @Test("a long-running agent's wait for work ends when its task is cancelled (another connection of the run stopped it)")
    func waitCancelled() async {
        let queue = JobQueue([])
        // On a thread of its own: on a loaded run the cooperative pool's few threads may all be busy for seconds.
        let waiting = Task(executorPreference: DispatchTaskExecutor()) { await queue.waitForWork(service: true) }
        // Parked first (the path a stopped run's other connections are on), then cancelled.
        #expect(await Polling.waitUntil(timeout: 10) { queue.parkedWaiters == 1 })
        waiting.cancel()
        #expect(await waiting.value == false)
        let early = Task { await queue.waitForWork(service: true) }
        early.cancel()
        #expect(await early.value == false, "cancelled before it parked")
    }

    @Test("a window is eight round trips and at least half a second; the kernel's send buffer limit is read, 4 MiB where it cannot be")
    func window() {
        #expect(ConnectionGrowth.window(roundTrip: nil) == .milliseconds(500))
        #expect(ConnectionGrowth.window(roundTrip: .milliseconds(20)) == .milliseconds(500))
        #expect(ConnectionGrowth.window(roundTrip: .milliseconds(300)) == .milliseconds(2400))
        #expect(Uploader.kernelSendBufferLimit() >= 4096)
    }

    @Test("a connection added by an adaptive run has two places (one upload sending, the next opening) and a 1/max share of the buffers")
    func addedShare() {
        var configuration = AgentConfiguration(relayHost: "relay", relayPort: 1, token: "t", caPath: nil)
        configuration.connections = 8
        let share = Uploader.addedConnectionShare(configuration, index: 3)
        #expect(share.concurrency == 2 && share.maxReadsInFlight == 1)
        #expect(share.chunkSize == 256 << 10 && share.writeBufferBytes >= share.chunkSize)
        #expect(share.writeBufferBytes <= configuration.writeBufferBytes / 4)
        #expect(share.readBatchBytes <= configuration.readBatchBytes / 2)
        #expect(Uploader.connectionsAtStart(configuration) == 1)
        configuration.adaptiveConnections = false
        #expect(Uploader.connectionsAtStart(configuration) == 5, "a fixed 8 is held to --concurrency's 5 places")
    }
}

/// Runs tasks' jobs on a serial dispatch queue, whatever Swift's cooperative pool is doing.
final class DispatchTaskExecutor: TaskExecutor, @unchecked Sendable {
    private let queue = DispatchQueue(label: "connection-growth-tests")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = self.asUnownedTaskExecutor()
        self.queue.async { job.runSynchronously(on: executor) }
    }
}
