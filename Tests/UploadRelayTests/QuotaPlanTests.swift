import NIOCore
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// PLAN and ROOM (SPEC §7.2) against the relay's real session, catalog and store: what a selection would add to the
/// account's quota use.
@Suite("Quota plans, in memory")
struct QuotaPlanTests {
    /// The ROOM a new connection to `backend` gets for `plan`.
    static func ask(_ backend: RelayBackend, _ plan: Frame.Plan) async throws -> Frame.Room {
        var pump = await Pump(backend: backend)
        await pump.connect(features: .quotaPlan)
        #expect(pump.agent.machine.features.contains(.quotaPlan))
        let frame = pump.agent.machine.sendPlan(plan)
        pump.agentSends([try #require(frame)])
        await pump.run()
        let rooms = pump.agent.events.compactMap { if case .room(let room) = $0 { return room } else { return nil } }
        #expect(rooms.count == 1, "\(pump.agent.events)")
        #expect(!pump.agent.machine.isClosed)
        await pump.relay.connectionClosed()
        return try #require(rooms.first)
    }

    static func bytes(_ count: Int, _ value: UInt8) -> [UInt8] { [UInt8](repeating: value, count: count) }

    @Test(
        "needs: a new key its size; a key holding an object nothing, or with OVERWRITE the difference; an unfinished upload less what it holds; a bad key its size"
    )
    func needs() async throws {
        let backend = try await RelayBackend { $0.syncBytes = 1000 }
        try await #require(try backend.relay.catalog.updateAccount(named: "cam-7", quota: .some(20_000), tokenHash: nil, revoked: nil))
        // A stored object of 3000 bytes.
        var first = await Pump(backend: backend)
        await first.connect()
        let stored = first.upload(MemoryAgent.Job(key: "have.jpg", data: Self.bytes(3000, 1)))
        await first.run()
        await first.runStorage()
        guard case .stored = first.agent.outcomes[stored] else {
            Issue.record("have.jpg was not stored: \(String(describing: first.agent.outcomes[stored]))")
            return
        }
        await first.relay.connectionClosed()
        // An unfinished upload of 8000 bytes, left with its durable bytes when its connection went.
        var second = await Pump(backend: backend)
        await second.connect()
        second.upload(MemoryAgent.Job(key: "half.mp4", data: Self.bytes(8000, 2), holdHash: true))
        await second.run()
        await second.runStorage()
        await second.relay.connectionClosed()
        let held = try #require(await backend.durableOffset("half.mp4"))
        #expect(held > 0 && held <= 8000)

        let room = try await Self.ask(
            backend,
            Frame.Plan(
                request: 41, overwrite: false,
                entries: [
                    .init(key: "have.jpg", size: 3000), .init(key: "have.jpg", size: 5000), .init(key: "new.png", size: 1500),
                    .init(key: "half.mp4", size: 8000), .init(key: "../up", size: 7), .init(rawKey: [0xFF, 0xFE], size: 9),
                ]
            )
        )
        #expect(room.request == 41)
        #expect(room.quota == 20_000)
        #expect(room.used == 3000 + UInt64(held))
        #expect(room.needs == [0, 0, 1500, 8000 - UInt64(held), 7, 9])

        let overwriting = try await Self.ask(
            backend, Frame.Plan(request: 1, overwrite: true, entries: [.init(key: "have.jpg", size: 5000), .init(key: "have.jpg", size: 1000)]))
        #expect(overwriting.needs == [2000, 0])

        // No quota: every selection fits, so the relay does not grant QUOTA_PLAN (a plan would only cost the agent a
        // round trip before its first OPEN), and the agent's machine will not send one.
        try await #require(try backend.relay.catalog.updateAccount(named: "cam-7", quota: .some(nil), tokenHash: nil, revoked: nil))
        var unlimited = await Pump(backend: backend)
        await unlimited.connect(features: .quotaPlan)
        #expect(!unlimited.agent.machine.features.contains(.quotaPlan))
        #expect(unlimited.agent.machine.sendPlan(Frame.Plan(request: 2, overwrite: false, entries: [])) == nil)
        await unlimited.relay.connectionClosed()
        #expect(!backend.holdsResources)
    }

    @Test("a PLAN of the most entries is answered in one ROOM that fits the smallest frame a side may announce")
    func largestPlan() async throws {
        let backend = try await RelayBackend()
        try await #require(try backend.relay.catalog.updateAccount(named: "cam-7", quota: .some(1 << 40), tokenHash: nil, revoked: nil))
        let entries = (0..<ProtocolLimits.maxPlanEntries).map { Frame.Plan.Entry(key: "photos/\($0).jpg", size: UInt64($0)) }
        let room = try await Self.ask(backend, Frame.Plan(request: 7, overwrite: false, entries: entries))
        #expect(room.needs == entries.map(\.size))
        #expect(Frame.room(room).encoded().readableBytes <= ProtocolLimits.smallestMaxFrameSize)
    }

    @Test("a revoked account's PLAN closes the connection with UNAUTHENTICATED")
    func revoked() async throws {
        let backend = try await RelayBackend()
        try await #require(try backend.relay.catalog.updateAccount(named: "cam-7", quota: .some(1 << 40), tokenHash: nil, revoked: nil))
        var pump = await Pump(backend: backend)
        await pump.connect(features: .quotaPlan)
        try await #require(try backend.relay.catalog.revokeAccount(named: "cam-7"))
        let frame = pump.agent.machine.sendPlan(Frame.Plan(request: 1, overwrite: false, entries: []))
        pump.agentSends([try #require(frame)])
        await pump.run()
        #expect(
            pump.agent.events.contains { if case .peerClosed(.unauthenticated, _) = $0 { return true } else { return false } }, "\(pump.agent.events)"
        )
    }
}
