import UploadProtocol

/// A quota plan asked on a connection (SPEC §7.2). A first PLAN with no entry asks for the quota and its use: when the
/// whole selection fits even if every byte of it counted (no quota, or room for all its sizes), that is the answer, and
/// the relay reads nothing per file. Otherwise the entries follow, at most ``ProtocolLimits/maxPlanEntries`` per PLAN
/// and one PLAN at a time.
struct QuotaPlanning {
    let entries: [Frame.Plan.Entry]
    var pending: ArraySlice<Frame.Plan.Entry>
    let overwrite: Bool
    /// Whether the PLAN with no entry went out.
    var probed = false
    var needs: [UInt64] = []
    var quota: UInt64? = nil
    var used: UInt64 = 0
    var request: UInt32 = 0

    init(_ request: QuotaPlan.Request) {
        self.entries = request.entries
        self.pending = request.entries[...]
        self.overwrite = request.overwrite
    }

    /// The sizes of the whole selection (saturating).
    var totalSize: UInt64 {
        self.entries.reduce(0) { $0.addingReportingOverflow($1.size).overflow ? .max : $0 + $1.size }
    }
}

extension AgentSession {
    /// The next PLAN, once the connection is up; without QUOTA_PLAN granted there is no plan, and the connection goes
    /// on (or closes) as if none had been asked.
    mutating func askPlan() -> [Action] {
        guard var planning = self.planning, !self.closed else { return [] }
        guard self.machine.canSendPlan else {
            self.planning = nil
            return [.log(.debug, "the relay does not answer quota plans (no QUOTA_PLAN)", [:])] + self.closeIfIdle()
        }
        var entries: [Frame.Plan.Entry] = []
        if planning.probed {
            let count = min(planning.pending.count, ProtocolLimits.maxPlanEntries)
            entries = Array(planning.pending.prefix(count))
            planning.pending = planning.pending.dropFirst(count)
        }
        planning.probed = true
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
    mutating func planAnswered(_ room: Frame.Room) -> [Action] {
        guard var planning = self.planning else { return [] }
        let wasProbe = planning.needs.isEmpty && planning.pending.count == planning.entries.count
        planning.needs += room.needs
        // The latest figures: each ROOM reads the catalog anew.
        planning.quota = room.quota
        planning.used = room.used
        self.planning = planning
        if wasProbe && !planning.entries.isEmpty {
            let total = planning.totalSize
            let fitsWhole = room.quota.map { quota in room.used <= quota && total <= quota - room.used } ?? true
            if fitsWhole {
                // Every byte may count and it still fits: each need is at most its size.
                return self.planDone(planning, needs: planning.entries.map(\.size))
            }
            return self.askPlan()
        }
        if !planning.pending.isEmpty {
            return self.askPlan()
        }
        return self.planDone(planning, needs: planning.needs)
    }

    private mutating func planDone(_ planning: QuotaPlanning, needs: [UInt64]) -> [Action] {
        self.outcome.quotaPlan = QuotaPlan(account: self.machine.terms?.account ?? "", quota: planning.quota, used: planning.used, needs: needs)
        self.planning = nil
        return self.closeIfIdle()
    }
}
