import UploadProtocol
import Logging

/// A quota plan asked on a connection (SPEC §7.2). A first PLAN with no entry asks for the quota and its use: when the
/// whole selection fits even if every byte of it counted (no quota, or room for all its sizes), that is the answer, and
/// the relay reads nothing per file. Otherwise the entries follow, at most ``ProtocolLimits/maxPlanEntries`` per PLAN
/// and one PLAN at a time.
struct QuotaPlanning {
    let entries: [Frame.Plan.Entry]
    var pending: ArraySlice<Frame.Plan.Entry>
    let overwrite: Bool
    /// Whether the ROOM of the PLAN with no entry came: the entries go out only after it.
    var probeAnswered = false
    var needs: [UInt64] = []
    var request: UInt32 = 0

    init(_ request: QuotaPlan.Request) {
        self.entries = request.entries
        self.pending = request.entries[...]
        self.overwrite = request.overwrite
    }
}

extension AgentSession {
    /// The next PLAN, once the connection is up; without QUOTA_PLAN granted there is no plan, and the connection goes
    /// on (or closes) as if none had been asked.
    mutating func askPlan() -> [Action] {
        guard var planning = self.planning, !self.closed else { return [] }
        guard self.machine.canSendPlan else {
            self.planning = nil
            return [.log(.debug, "the relay does not answer quota plans (no QUOTA_PLAN)", [:])] + self.planOver()
        }
        var entries: [Frame.Plan.Entry] = []
        if planning.probeAnswered {
            let count = min(planning.pending.count, ProtocolLimits.maxPlanEntries)
            entries = Array(planning.pending.prefix(count))
            planning.pending = planning.pending.dropFirst(count)
        }
        planning.request &+= 1
        self.planning = planning
        guard let frame = self.machine.sendPlan(Frame.Plan(request: planning.request, overwrite: planning.overwrite, entries: entries))
        else {
            self.planning = nil
            return self.closeIfIdle()
        }
        return self.write(frame)
    }

    /// A ROOM for the PLAN sent last (the state machine checked that it answers it): the next PLAN, or the plan done.
    /// The latest ROOM's quota and use are the answer's: each ROOM reads the catalog anew.
    mutating func planAnswered(_ room: Frame.Room) -> [Action] {
        guard var planning = self.planning else { return [] }
        let account = self.machine.terms?.account ?? ""
        if !planning.probeAnswered {
            planning.probeAnswered = true
            self.planning = planning
            // Every byte may count and it still fits: each need is at most its size.
            let bound = QuotaPlan(account: account, quota: room.quota, used: room.used, needs: planning.entries.map(\.size))
            return bound.fits ? self.planDone(bound) : self.askPlan()
        }
        planning.needs += room.needs
        self.planning = planning
        if !planning.pending.isEmpty {
            return self.askPlan()
        }
        return self.planDone(QuotaPlan(account: account, quota: room.quota, used: room.used, needs: planning.needs))
    }

    private mutating func planDone(_ plan: QuotaPlan) -> [Action] {
        self.outcome.quotaPlan = plan
        self.planning = nil
        return self.planOver()
    }
}
