import Logging
import NIOCore
import UploadProtocol

/// Opening uploads, running their pipelines, and the GOAWAY drain.
extension RelaySession {
    // MARK: Opening (SPEC §4.2, §11)

    /// OPEN passed the state machine: claim the key, take an upload slot, look the upload up. Also called again for an
    /// OPEN that waited for its key.
    package mutating func openUpload(_ open: Frame.Open, _ key: ObjectKey) -> [Action] {
        guard let account = self.account, !self.closed else { return [] }
        let id = open.streamID
        let cancelledWhileWaiting = self.waitingForKey.removeValue(forKey: id) ?? false
        guard self.machine.isOpening(id) else {
            // Closed while it waited for its key: nothing was claimed for it, but a CANCEL still abandons the session
            // the OPEN named (SPEC §3.11).
            // A PART's CANCEL gives its stripe up, never the striped upload (SPEC §6.7).
            return cancelledWhileWaiting && open.part == nil ? [.discardSession(open, key, account)] : []
        }
        // A PART stream claims its stripe: the main stream holds the key meanwhile (SPEC §6.7).
        let claim =
            open.part.map { KeyClaims.stripeName(account: account.name, key: key.value, index: Int($0)) }
            ?? KeyClaims.name(account: account.name, key: key.value)
        let keyFreed = self.keyFreed
        switch self.resources.claims.claim(claim, whenFree: { keyFreed(open, key) }) {
        case .busy:
            let what = open.part.map { "stripe \($0) of \"\(key)\" is being sent on another stream" } ?? "another upload of \"\(key)\" is in progress"
            return self.write(self.machine.resetStream(id, .keyBusy, "\(what); retry when it ends", now: self.latestInputAt))
        case .queued:
            // The key's last upload is closing: this OPEN goes on once it is released.
            self.waitingForKey[id] = false
            return []
        case .claimed:
            break
        }
        // Each open upload holds a descriptor for its staging file: past the budget, refuse before opening one, so that
        // connections together never run the relay out of descriptors.
        guard self.resources.uploadSlots.take(for: account.name) else {
            self.resources.claims.release(claim)
            let slots = self.resources.uploadSlots
            let message =
                slots.inUse >= slots.total
                ? "the relay has \(slots.total) uploads open, its limit (file descriptors); retry shortly"
                : "account \"\(account.name)\" has \(slots.held(by: account.name)) uploads open, its share of the relay's \(slots.total); retry when one ends"
            return self.write(self.machine.resetStream(id, .refusedStream, message, now: self.latestInputAt))
        }
        self.opening[id] = (claim, nil)
        self.lookupQueue.append((open, key, account))
        return self.startLookups()
    }

    /// Starts the lookups of queued OPENs while fewer than ``RelaySessionSettings/lookupsPerConnection`` run. An OPEN
    /// whose stream closed while it waited is looked up all the same: the lookup's answer is dropped as for one that
    /// closed while it ran (``streamClosedWhileOpening(_:discard:)``), and its claim and slot go back then.
    ///
    /// Without the bound, 100 agents opening 60 files each made 6,000 lookups at once, each a suspended task (42 MB of
    /// task memory at the relay's peak) queued behind the account's quota decisions, which run one at a time anyway.
    mutating func startLookups() -> [Action] {
        var actions: [Action] = []
        while self.lookupsInFlight < self.resources.settings.lookupsPerConnection, !self.lookupQueue.isEmpty {
            let (open, key, account) = self.lookupQueue.removeFirst()
            self.lookupsInFlight += 1
            actions.append(.lookUp(open, key, account))
        }
        return actions
    }

    /// The lookup of stream `id`'s OPEN returned: its answer, then the next queued OPEN's lookup.
    package mutating func uploadLookedUp(_ id: StreamID, _ decision: LookUp, key: ObjectKey) -> [Action] {
        self.lookupsInFlight = max(0, self.lookupsInFlight - 1)
        let actions = self.lookedUp(id, decision, key: key)
        return actions + self.startLookups()
    }

    private mutating func lookedUp(_ id: StreamID, _ decision: LookUp, key: ObjectKey) -> [Action] {
        guard let (claim, closedMeanwhile) = self.opening.removeValue(forKey: id) else { return [] }
        var actions: [Action] = []
        switch decision {
        case .stored, .confirm:
            self.giveSlot()
            self.resources.claims.release(claim)
            let offset: Frame.Offset
            if case .stored(let size) = decision {
                offset = Frame.Offset(streamID: id, disposition: .stored, offset: size)
            } else {
                offset = Frame.Offset(streamID: id, disposition: .confirm, offset: 0)
            }
            if !self.closed, let frame = self.machine.sendOffset(offset) {
                actions += self.write(frame)
                if let credit = self.machine.flushConnectionCredit() { actions += self.write(credit) }
            }
        case .refuse(let code, let message):
            self.giveSlot()
            self.resources.claims.release(claim)
            if !self.closed { actions += self.write(self.machine.resetStream(id, code, message, now: self.latestInputAt)) }
        case .upload, .stripe:
            var durableOffset: Int64 = 0
            var resumeToken: [UInt8] = []
            var resumed = false
            var byteLimit: Int64? = nil
            if case .upload(let offset, let token, let resumedUpload, let limit) = decision {
                (durableOffset, resumeToken, resumed, byteLimit) = (offset, token, resumedUpload, limit)
            }
            let configuration = self.resources.settings
            var settings = UploadPipeline.Settings(
                streamID: id, key: key.value, account: self.account?.name ?? "", byteLimit: byteLimit,
                maxBlobSize: configuration.maxBlobSize, syncBytes: Int64(configuration.syncBytes)
            )
            if case .stripe = decision { settings.syncs = false }
            self.pipelines[id] = UploadPipeline(settings: settings, durableOffset: durableOffset)
            self.uploadClaims[id] = claim
            let offset = Frame.Offset(
                streamID: id, disposition: resumed ? .resume : .start, offset: UInt64(durableOffset), resumeToken: resumeToken
            )
            guard !self.closed, let frame = self.machine.sendOffset(offset) else {
                // The agent cancelled, or the connection went, while the relay looked the upload up.
                return self.abortUpload(id, keepSession: !(closedMeanwhile ?? false)) + self.closeIfDrained()
            }
            actions += self.write(frame)
            actions.append(.log(.debug, "upload open", ["stream.id": "\(id)", "upload.key": "\(key)", "upload.offset": "\(durableOffset)"]))
        }
        return actions + self.closeIfDrained()
    }

    /// A stream closed while its upload is looked up (or its OPEN waits for the key): its key is closing now (an OPEN
    /// of it waits, not KEY_BUSY), and the lookup's result is dropped when it returns.
    ///
    /// A discard is never taken back: a CANCEL followed by the connection's close still drops the session (the hostile
    /// suite's OPEN+CANCEL flood left staging files behind when the connection closed before the lookups returned).
    mutating func streamClosedWhileOpening(_ id: StreamID, discard: Bool) {
        if let cancelled = self.waitingForKey[id] {
            self.waitingForKey[id] = cancelled || discard
            return
        }
        guard let (claim, closedMeanwhile) = self.opening[id] else { return }
        self.resources.claims.markClosing(claim)
        self.opening[id] = (claim, closedMeanwhile == true || discard)
    }

    // MARK: Pipelines

    /// Feeds one input to stream `id`'s pipeline, if it has one, and runs what it decides.
    mutating func step(_ id: StreamID, _ input: (inout UploadPipeline) -> [UploadPipeline.Action]) -> [Action] {
        guard var pipeline = self.pipelines[id] else { return [] }
        let steps = input(&pipeline)
        self.pipelines[id] = pipeline
        return self.run(steps, of: id)
    }

    mutating func abortUpload(_ id: StreamID, keepSession: Bool) -> [Action] {
        self.step(id) { $0.abort(keepSession: keepSession) }
    }

    /// A storage step of stream `id` finished.
    package mutating func storageFinished(_ id: StreamID, _ completion: StorageCompletion) -> [Action] {
        if case .released = completion {
            // Storage has let go of the upload (its staging closed, its session dropped when asked), on a connection
            // open or closed: only now may another OPEN of the key go on.
            if let claim = self.releasing.removeValue(forKey: id) {
                self.giveSlot()
                self.resources.claims.release(claim)
            }
            return []
        }
        let actions = self.step(id) { pipeline in
            switch completion {
            case .wrote(let consumed, let error): return pipeline.writeFinished(consumed: consumed, error: error)
            case .synced(let result): return pipeline.syncFinished(result)
            case .committed(let result): return pipeline.commitFinished(result)
            case .released: return []
            }
        }
        return actions + self.closeIfDrained()
    }

    /// How a storage step ended.
    package enum StorageCompletion {
        case wrote(consumed: [Int], error: (WireErrorCode, String)?)
        case synced(Result<Int64, UploadPipeline.SyncFailure>)
        case committed(Result<Frame.Result.Status, UploadPolicy.Refusal>)
        /// The release step is done: the upload's slot and key claim go back.
        case released
    }

    /// Turns a pipeline's decisions into the connection's: reports become frames, claims and slots are given back,
    /// storage steps go to the handler.
    mutating func run(_ steps: [UploadPipeline.Action], of id: StreamID) -> [Action] {
        var actions: [Action] = []
        for step in steps {
            switch step {
            case .storage(let work):
                if case .release = work {
                    // The handler closes the staging file (and drops the session); the slot and the key go back when
                    // it reports that done (``storageFinished(_:_:)``).
                    self.pipelines[id] = nil
                    if let claim = self.uploadClaims.removeValue(forKey: id) { self.releasing[id] = claim }
                }
                actions.append(.storage(id, work))
            case .armSyncTimer:
                actions.append(.schedule(.sync(id), in: TimeAmount(self.resources.settings.syncInterval)))
            case .cancelSyncTimer:
                actions.append(.cancel(.sync(id)))
            case .markClosing:
                if let claim = self.uploadClaims[id] { self.resources.claims.markClosing(claim) }
            case .releaseCommitted:
                self.pipelines[id] = nil
                self.giveSlot()
                if let claim = self.uploadClaims.removeValue(forKey: id) { self.resources.claims.release(claim) }
                actions.append(.dropStorage(id))
            case .report(let event):
                actions += self.report(event, of: id)
            }
        }
        return actions
    }

    private mutating func report(_ event: UploadPipeline.Event, of id: StreamID) -> [Action] {
        guard !self.closed else { return [] }
        switch event {
        case .consumed(let bytes):
            self.shareWindow()
            return self.write(self.machine.storageConsumed(id, bytes: bytes))
        case .durable(let offset):
            return self.machine.sendAck(id, offset: offset).map { self.write($0) } ?? []
        case .committed(let result):
            var actions: [Action] = []
            if let frame = self.machine.sendResult(result) {
                actions += self.write(frame)
                if let credit = self.machine.flushConnectionCredit() { actions += self.write(credit) }
            }
            let metadata: [String: Logger.MetadataValue] = [
                "upload.key": "\(result.key)", "upload.size": "\(result.size)", "upload.sha1": "\(result.sha1)",
            ]
            return actions + [.log(.info, "upload committed", metadata)]
        case .failed(let code, let message):
            let metadata: [String: Logger.MetadataValue] = ["stream.id": "\(id)", "error.code": "\(code.name)", "error.message": "\(message)"]
            return [.log(.info, "upload failed", metadata)] + self.write(self.machine.resetStream(id, code, message, now: self.latestInputAt))
        }
    }

    // MARK: Graceful shutdown (SPEC §6.5)

    /// Shutdown began: GOAWAY, then the drain period.
    package mutating func shutdown() -> [Action] {
        guard !self.closed, case .none = self.drain else { return [] }
        guard self.machine.isReady, let goAway = self.machine.sendGoAway(.noError, "relay shutting down; resume on a new connection") else {
            return self.close()
        }
        self.drain = .draining
        return self.write(goAway) + [.schedule(.grace, in: TimeAmount(self.resources.settings.shutdownGrace))] + self.closeIfDrained()
    }

    /// The drain period ended: make every upload durable, then close once each is quiet; after a second grace period,
    /// close anyway.
    mutating func graceEnded() -> [Action] {
        guard !self.closed else { return [] }
        let grace = self.resources.settings.shutdownGrace
        switch self.drain {
        case .none:
            return []
        case .draining:
            self.drain = .finishing
            var actions: [Action] = [.log(.info, "drain period over: acknowledging what arrived, then closing", ["grace": "\(grace)"])]
            for id in self.pipelines.keys.sorted() {
                actions += self.step(id) { $0.requestSync() }
            }
            return actions + [.schedule(.grace, in: TimeAmount(grace))] + self.closeIfDrained()
        case .finishing:
            let log = Action.log(.warning, "closing connection: uploads not durable within the shutdown grace period", ["grace": "\(grace)"])
            return [log] + self.close()
        }
    }

    /// Closes when the connection has nothing left to do: during the drain, once no stream is open; after it, once every
    /// open upload is durable and acknowledged and none is verifying.
    mutating func closeIfDrained() -> [Action] {
        guard !self.closed else { return [] }
        switch self.drain {
        case .none:
            // After the agent's GOAWAY the agent closes when it is done (SPEC §4.1); the idle timeout covers one that never does.
            return []
        case .draining:
            return self.machine.openStreamCount == 0 ? self.close() : []
        case .finishing:
            let open = self.pipelines.values.filter(\.isOpen)
            return self.machine.openStreamCount == 0 || open.allSatisfy({ $0.isQuiet && !$0.isVerifying }) ? self.close() : []
        }
    }
}

extension RelaySession {
    /// An upload of this connection's account gave its slot back.
    fileprivate func giveSlot() {
        guard let account = self.account else { return }
        self.resources.uploadSlots.give(for: account.name)
    }
}
