import NIOCore
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadAgent

/// The agent's side of a quota plan (SPEC §7.2): the PLANs a connection sends and what it makes of the ROOMs, and which
/// items of a selection fit.
@Suite("Quota plans, agent side")
struct AgentQuotaPlanTests {
    static func welcome(features: Frame.Features) -> Frame {
        .welcome(
            Frame.Welcome(
                version: 1, maxFrameSize: 1 << 20, features: features, maxStreams: 64, connectionWindow: 1 << 20, streamWindow: 1 << 20,
                maxKeyLength: 1024, idleTimeoutMillis: 120_000, account: "cam-7"
            )
        )
    }

    /// A session on an empty queue that asks `entries`, connected and welcomed with `features`.
    static func session(_ entries: [(key: String, size: UInt64)], features: Frame.Features) -> (AgentHarness, [AgentSession.Action]) {
        var harness = AgentHarness(files: 0)
        harness.session = AgentSession(
            configuration: harness.session.configuration, queue: harness.queue, plan: QuotaPlan.Request(entries: entries, overwrite: false))
        let hello = AgentHarness.frames(harness.session.connected(now: .now))
        if case .hello(let h) = hello.first { #expect(h.features.contains(.quotaPlan)) } else { Issue.record("no HELLO") }
        let actions = harness.receive(Self.welcome(features: features))
        return (harness, actions)
    }

    static func plans(_ actions: [AgentSession.Action]) -> [Frame.Plan] {
        AgentHarness.frames(actions).compactMap { if case .plan(let plan) = $0 { return plan } else { return nil } }
    }

    static func closes(_ actions: [AgentSession.Action]) -> Bool {
        actions.contains { if case .close = $0 { return true } else { return false } }
    }

    @Test("first a PLAN with no entry; when the sizes of the whole selection fit in what is left, that is the answer")
    func probeAnswers() async throws {
        var (harness, actions) = Self.session([("a", 400), ("b", 500)], features: .quotaPlan)
        let probe = try #require(Self.plans(actions).first)
        #expect(probe.entries.isEmpty)
        actions = harness.receive(.room(Frame.Room(request: probe.request, quota: 2000, used: 1000, needs: [])))
        #expect(Self.plans(actions).isEmpty)
        #expect(Self.closes(actions))
        let plan = try #require(harness.session.outcome.quotaPlan)
        #expect(plan.account == "cam-7" && plan.fits && plan.left == 1000 && plan.needs == [400, 500])
    }

    @Test("when the sizes do not fit, the entries follow, 1000 per PLAN and one PLAN at a time, and the needs come back in order")
    func entriesFollow() async throws {
        let entries = (0..<2500).map { (key: "p/\($0).jpg", size: UInt64(10)) }
        var (harness, actions) = Self.session(entries, features: .quotaPlan)
        var plan = try #require(Self.plans(actions).first)
        actions = harness.receive(.room(Frame.Room(request: plan.request, quota: 20_000, used: 0, needs: [])))
        var sent: [Frame.Plan] = []
        while let next = Self.plans(actions).first {
            #expect(Self.plans(actions).count == 1)
            sent.append(next)
            plan = next
            // Every tenth file is on the relay already.
            let needs = next.entries.map { entry -> UInt64 in String(decoding: entry.rawKey, as: UTF8.self).hasSuffix("0.jpg") ? 0 : entry.size }
            actions = harness.receive(.room(Frame.Room(request: plan.request, quota: 20_000, used: 1000, needs: needs)))
        }
        #expect(sent.map(\.entries.count) == [1000, 1000, 500])
        #expect(sent.flatMap(\.entries).map(\.rawKey) == entries.map { Array($0.key.utf8) })
        #expect(Self.closes(actions))
        let answer = try #require(harness.session.outcome.quotaPlan)
        #expect(answer.needs.count == 2500)
        #expect(answer.needed == 2500 * 10 - 250 * 10)
        #expect(!answer.fits)
        #expect(answer.overflow.count == 2250 - 1900)
    }

    @Test(
        "kept after its plan: the answer is told, the connection stays up and idle; a run then takes it: its jobs open there, its outcome its own"
    )
    func keptForTheRun() async throws {
        var harness = AgentHarness(files: 2)
        let empty = JobQueue([])
        harness.session = AgentSession(
            configuration: harness.session.configuration, queue: empty, plan: QuotaPlan.Request(entries: [("k0", 400)], overwrite: false),
            keepAfterPlan: true)
        _ = harness.session.connected(roundTrip: .milliseconds(100), now: .now)
        var actions = harness.receive(Self.welcome(features: .quotaPlan))
        #expect(actions.contains { if case .event(.connected(_, "cam-7")) = $0 { return true } else { return false } })
        let probe = try #require(Self.plans(actions).first)
        actions = harness.receive(.room(Frame.Room(request: probe.request, quota: 2000, used: 0, needs: [])))
        #expect(!Self.closes(actions), "kept: not closed")
        let told = actions.compactMap { if case .planned(let outcome) = $0 { return outcome } else { return nil } }
        #expect(told.count == 1 && told.first?.quotaPlan?.fits == true && told.first?.parked == true, "\(actions)")
        // Idle meanwhile: a keepalive period is answered with a PING, not a close.
        #expect(Self.closes(harness.session.jobsChanged()) == false)
        #expect(AgentHarness.frames(harness.session.silentPeriod()).contains { if case .ping = $0 { return true } else { return false } })

        actions = harness.session.adopt(harness.queue)
        #expect(actions.contains { if case .event(.connected(_, "cam-7")) = $0 { return true } else { return false } }, "the run hears it")
        let prepared = actions.compactMap { if case .prepare(let job, _, _) = $0 { return job.key } else { return nil } }
        #expect(prepared.first == "k0", "the run's jobs start on the kept connection: \(prepared)")
        #expect(harness.session.outcome.quotaPlan == nil && !harness.session.outcome.parked && harness.session.outcome.welcomed)
        #expect(harness.session.adopt(JobQueue([])).isEmpty, "taken once")
    }

    @Test("kept after its plan, but the relay answers none: told at once (no plan), kept all the same")
    func keptWithoutFeature() async {
        var harness = AgentHarness(files: 0)
        harness.session = AgentSession(
            configuration: harness.session.configuration, queue: harness.queue, plan: QuotaPlan.Request(entries: [("a", 1)], overwrite: false),
            keepAfterPlan: true)
        _ = harness.session.connected(now: .now)
        let actions = harness.receive(Self.welcome(features: []))
        #expect(!Self.closes(actions))
        let told = actions.compactMap { if case .planned(let outcome) = $0 { return outcome } else { return nil } }
        #expect(told.count == 1 && told.first?.quotaPlan == nil && told.first?.parked == true)
    }

    @Test(
        "kept with no plan (opened beside the quota plan's): no PLAN, told once welcomed, idle until a run takes it; not kept, it never parks"
    )
    func keptWithoutPlan() async throws {
        var harness = AgentHarness(files: 1)
        harness.session = AgentSession(configuration: harness.session.configuration, queue: JobQueue([]), keepAfterPlan: true)
        _ = harness.session.connected(roundTrip: .milliseconds(100), now: .now)
        var actions = harness.receive(Self.welcome(features: .quotaPlan))
        #expect(Self.plans(actions).isEmpty, "no PLAN: none was asked")
        #expect(!Self.closes(actions), "kept: not closed")
        let told = actions.compactMap { if case .planned(let outcome) = $0 { return outcome } else { return nil } }
        #expect(told.count == 1 && told.first?.parked == true && told.first?.quotaPlan == nil && told.first?.welcomed == true, "\(actions)")
        #expect(!Self.closes(harness.session.jobsChanged()))
        actions = harness.session.adopt(harness.queue)
        let prepared = actions.compactMap { if case .prepare(let job, _, _) = $0 { return job.key } else { return nil } }
        #expect(prepared == ["k0"], "the run's job starts on it: \(prepared)")

        var plain = AgentHarness(files: 0)
        plain.session = AgentSession(configuration: plain.session.configuration, queue: JobQueue([]))
        _ = plain.session.connected(now: .now)
        actions = plain.receive(Self.welcome(features: .quotaPlan))
        #expect(!actions.contains { if case .planned = $0 { return true } else { return false } }, "not kept: nothing parks")
    }

    @Test("a relay without QUOTA_PLAN: no PLAN, no answer, the connection closes as an idle one")
    func relayWithoutFeature() async {
        let (harness, actions) = Self.session([("a", 1)], features: [])
        #expect(Self.plans(actions).isEmpty)
        #expect(Self.closes(actions))
        #expect(harness.session.outcome.quotaPlan == nil)
    }

    @Test("overflow: in order, passing over what does not fit and taking smaller ones after it; nothing when all fit")
    func overflow() async {
        #expect(QuotaPlan(quota: nil, used: 5, needs: [1, 2]).overflow.isEmpty)
        #expect(QuotaPlan(quota: 10, used: 7, needs: [3, 0]).overflow.isEmpty)
        #expect(QuotaPlan(quota: 10, used: 2, needs: [5, 4, 1, 0, 2]).overflow == [1])
        #expect(QuotaPlan(quota: 10, used: 2, needs: [5, 4, 1, 0, 3]).overflow == [1, 4])
        #expect(QuotaPlan(quota: 10, used: 12, needs: [0, 1]).overflow == [1])
        #expect(QuotaPlan(quota: 10, used: 12, needs: [0, 1]).left == 0)
        #expect(QuotaPlan(quota: 1, used: 0, needs: [.max, .max]).needed == .max)
    }
}
