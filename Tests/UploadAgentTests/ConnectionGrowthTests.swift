import Testing

@testable import UploadAgent

/// An adaptive run's decisions: more connections only on a long link, only while each one raised the rate, only when
/// there is work for them, never above the maximum.
@Suite("Adaptive connections")
struct ConnectionGrowthTests {
    /// The decisions of `samples` (round trip, rate, work waiting) in order.
    static func decisions(_ growth: inout ConnectionGrowth, _ samples: [(Duration?, Double, Bool)]) -> [Bool] {
        samples.map { growth.sample(roundTrip: $0.0, rate: $0.1, workWaiting: $0.2) }
    }

    @Test("a short round trip (loopback, a LAN) opens no other connection, whatever the rate and the work waiting")
    func shortLink() {
        var growth = ConnectionGrowth(maximum: 8)
        let first = Self.decisions(&growth, [(nil, 0, true)])
        #expect(first == [false] && !growth.settled, "no round trip measured yet: not settled")
        let then = Self.decisions(&growth, [(.microseconds(60), 500e6, true), (.milliseconds(100), 1e6, true)])
        #expect(then == [false, false], "settled on the short link, and stays settled")
        #expect(growth.settled && growth.running == 1)
    }

    @Test("a long link opens one more per window while each added one raised the rate by 20 %, and settles when one did not")
    func longLink() {
        var growth = ConnectionGrowth(maximum: 8)
        let rtt = Duration.milliseconds(100)
        // The first is added on the link's length alone; 2 -> 3 raised the rate 92 %; 3 -> 4 only 10 %.
        let added = Self.decisions(&growth, [(rtt, 0, true), (rtt, 26e6, true), (rtt, 50e6, true), (rtt, 55e6, true)])
        #expect(added == [true, true, true, false])
        #expect(growth.settled && growth.running == 4)
        #expect(growth.reason?.contains("20 %") == true, "\(growth.reason ?? "")")
    }

    @Test("no work waiting for a new connection: none opened, asked again next window; the maximum is never passed")
    func workAndMaximum() {
        var growth = ConnectionGrowth(maximum: 3)
        let rtt = Duration.milliseconds(40)
        let idle = Self.decisions(&growth, [(rtt, 10e6, false)])
        #expect(idle == [false] && !growth.settled)
        let added = Self.decisions(&growth, [(rtt, 10e6, true), (rtt, 20e6, true), (rtt, 90e6, true)])
        #expect(added == [true, true, false])
        #expect(growth.running == 3 && growth.settled)
        var one = ConnectionGrowth(maximum: 1)
        let none = Self.decisions(&one, [(rtt, 0, true)])
        #expect(one.settled && none == [false])
    }

    @Test("a window is ten round trips and at least a second")
    func window() {
        #expect(ConnectionGrowth.window(roundTrip: nil) == .seconds(1))
        #expect(ConnectionGrowth.window(roundTrip: .milliseconds(20)) == .seconds(1))
        #expect(ConnectionGrowth.window(roundTrip: .milliseconds(300)) == .seconds(3))
    }

    @Test("a connection added by an adaptive run carries one upload at a time, with a 1/max share of the buffers")
    func addedShare() {
        var configuration = AgentConfiguration(relayHost: "relay", relayPort: 1, token: "t", caPath: nil)
        configuration.connections = 8
        let share = Uploader.addedConnectionShare(configuration, index: 3)
        #expect(share.concurrency == 1 && share.maxReadsInFlight == 1)
        #expect(share.chunkSize == 256 << 10 && share.writeBufferBytes >= share.chunkSize)
        #expect(share.writeBufferBytes <= configuration.writeBufferBytes / 4)
        #expect(share.readBatchBytes <= configuration.readBatchBytes / 2)
        #expect(Uploader.connectionsAtStart(configuration) == 1)
        configuration.adaptiveConnections = false
        #expect(Uploader.connectionsAtStart(configuration) == 5, "a fixed 8 is held to --concurrency's 5 places")
    }
}
