import UploadProtocol

/// The decisions of one upload's storage work, with no I/O (SPEC §4.4, §6.1, §8.3): what to write, when to make it
/// durable, when to commit, when to let go, and what to tell the connection. ``UploadExecutor`` runs the actions it
/// returns as tasks of the relay's and feeds their completions back.
///
/// Work runs one piece at a time, in order. Durability comes before more writes, so what is consumed (and its credit
/// returned) never runs ahead of what is durable by more than the sync batch plus one write batch.
package struct UploadPipeline {
    private enum Phase: Hashable {
        /// The stream is open: events flow to the connection.
        case open
        /// The stream has ended on the wire. With `keep`, the bytes received are still written and made durable (so a
        /// resume re-sends nothing the relay already took), then the upload is released; without,
        /// the session and its staged bytes are dropped.
        case ending(keep: Bool)
        /// Staging file closed, key given back (or being given back).
        case released
    }

    private let settings: Settings
    private var phase = Phase.open
    /// Bytes handed to the staging file.
    private(set) var written: Int64
    /// Bytes synced and recorded in the catalog.
    private(set) var durable: Int64
    /// Bytes handed to the last sync. A store that keeps bytes in parts (S3: at least 5 MiB each, but the last) may make
    /// fewer durable than it was handed, keeping the rest for the next sync: it is asked again only once more is written.
    private var attempted: Int64
    /// Bytes the stream has carried: durable at OPEN, plus every chunk accepted since (written, in flight or queued).
    private var received: Int64
    /// Bytes received but not yet handed to storage.
    private var queued: [Frame.Chunk] = []
    private var queuedBytes: Int64 = 0
    /// Storage work is under way.
    private var busy = false
    private var syncRequested = false
    private var timerArmed = false
    private var pendingHash: Frame.Hash? = nil

    /// A pipeline for a session whose bytes below `durableOffset` are durable already.
    init(settings: Settings, durableOffset: Int64) {
        self.settings = settings
        self.written = durableOffset
        self.durable = durableOffset
        self.attempted = durableOffset
        self.received = durableOffset
    }

    /// Whether every received byte was made as durable as the store can make it, and no work is in flight.
    var isQuiet: Bool { !self.busy && self.queued.isEmpty && (self.written == self.attempted || !self.settings.syncs) }
    /// Whether HASH arrived and the upload is verifying or committing (SPEC §4.4 VERIFYING).
    var isVerifying: Bool { self.pendingHash != nil }
    var isOpen: Bool { self.phase == .open }

    // MARK: Input from the connection

    /// A chunk the connection's state machine accepted (in order, within credit).
    mutating func enqueue(_ chunk: Frame.Chunk) -> [Action] {
        guard self.isOpen else { return [] }
        self.queued.append(chunk)
        self.queuedBytes += Int64(chunk.payloadLength)
        self.received += Int64(chunk.payloadLength)
        var actions: [Action] = []
        // Counts the batch being written too: checked against written and queued bytes only, an upload of unknown size
        // could pass its limit by a batch.
        if let limit = self.settings.byteLimit, self.received > limit {
            let quota = limit < self.settings.maxBlobSize
            actions += self.fail(
                quota ? .quotaExceeded : .tooLarge,
                quota
                    ? "account \"\(self.settings.account)\" would exceed its quota at \(self.received) bytes"
                    : "blob passes this relay's limit of \(limit) bytes",
                keep: false
            )
        }
        return actions + self.next()
    }

    /// HASH arrived: commit once everything before it is stored.
    mutating func finish(_ hash: Frame.Hash) -> [Action] {
        guard self.isOpen else { return [] }
        self.pendingHash = hash
        return self.next()
    }

    /// Make everything received durable and acknowledged soon (graceful shutdown).
    mutating func requestSync() -> [Action] {
        guard self.isOpen, self.settings.syncs, self.written > self.attempted || !self.queued.isEmpty else { return [] }
        self.syncRequested = true
        return self.next()
    }

    /// The stream ended without a commit (reset by either side, cancelled, connection gone). With `keepSession` the
    /// bytes received so far are written and made durable first, so the agent resumes after them; otherwise the
    /// session and its staged bytes are dropped (CANCEL, or bytes that are worthless).
    mutating func abort(keepSession: Bool) -> [Action] {
        guard self.isOpen else { return [] }
        return self.end(keep: keepSession) + self.next()
    }

    /// The sync interval passed since bytes were written and not made durable.
    mutating func syncTimerFired() -> [Action] {
        self.timerArmed = false
        self.syncRequested = true
        return self.next()
    }

    // MARK: Completions of storage work

    /// A write finished: `consumed` holds the payload length of each chunk written, in order; `error` is the stream
    /// error of the chunk that stopped the batch (a bad chunk is never written), or the storage failure.
    mutating func writeFinished(consumed: [Int], error: (WireErrorCode, String)?) -> [Action] {
        self.busy = false
        var actions: [Action] = []
        for count in consumed {
            self.written += Int64(count)
            if self.isOpen { actions.append(.report(.consumed(count))) }
        }
        if let (code, message) = error {
            // What came before a bad chunk is made durable for a resume (SPEC §8.1).
            self.dropQueue()
            actions += self.fail(code, message, keep: true)
        }
        // After HASH the commit makes the rest durable: no sync is due.
        if self.isOpen, self.settings.syncs, self.written > self.attempted, self.pendingHash == nil {
            if self.written - self.durable >= self.settings.syncBytes {
                self.syncRequested = true
            } else if !self.timerArmed {
                self.timerArmed = true
                actions.append(.armSyncTimer)
            }
        }
        return actions + self.next()
    }

    /// A sync finished: the bytes through `offset` are durable and recorded (an offset not above the durable one: the
    /// store kept the new bytes back, see ``attempted``), or the failure says why not.
    mutating func syncFinished(_ result: Result<Int64, SyncFailure>) -> [Action] {
        self.busy = false
        var actions: [Action] = []
        switch result {
        case .success(let offset):
            // A store that keeps bytes in parts may have made none of the new ones durable: nothing to acknowledge.
            let advanced = offset > self.durable
            self.durable = max(self.durable, offset)
            if self.isOpen && advanced { actions.append(.report(.durable(UInt64(offset)))) }
        case .failure(let failure):
            actions += self.fail(.storageError, failure.description, keep: true)
            // Nothing more can be made durable: let go.
            self.dropQueue()
            self.written = self.durable
            self.attempted = self.durable
        }
        return actions + self.next()
    }

    /// The commit finished: the object is stored (or unchanged), or refused.
    mutating func commitFinished(_ result: Result<Frame.Result.Status, UploadPolicy.Refusal>) -> [Action] {
        self.busy = false
        switch result {
        case .success(let status):
            guard self.isOpen, let hash = self.pendingHash else {
                // CANCEL crossed the commit (SPEC §3.11: the agent assumes neither outcome).
                return self.next()
            }
            // The key is closing before RESULT goes out: an OPEN after RESULT waits for it, never KEY_BUSY.
            var actions = self.end(keep: false)
            self.phase = .released
            actions.append(.releaseCommitted)
            let result = Frame.Result(
                streamID: self.settings.streamID, status: status, size: hash.size, sha1: hash.sha1, key: self.settings.key
            )
            actions.append(.report(.committed(result)))
            return actions
        case .failure(let refusal):
            return self.fail(refusal.code, refusal.message, keep: refusal.keepSession) + self.next()
        }
    }

    // MARK: Decisions

    /// The next piece of storage work, if none is under way; or letting go, once an ended stream's work is done.
    private mutating func next() -> [Action] {
        guard !self.busy else { return [] }
        switch self.phase {
        case .released:
            return []
        case .open:
            if self.syncRequested && self.written > self.attempted && self.pendingHash == nil {
                return self.sync()
            } else if !self.queued.isEmpty {
                return self.write()
            } else if let hash = self.pendingHash {
                // No sync of its own first: the commit makes the bytes durable with the object (SPEC §8.3), and RESULT
                // says more than an ACK would. A commit that fails keeping the session makes them durable on the way out.
                var actions: [Action] = []
                if self.timerArmed {
                    self.timerArmed = false
                    actions.append(.cancelSyncTimer)
                }
                self.syncRequested = false
                self.busy = true
                return actions + [.storage(.commit(hash, written: self.written))]
            } else if self.syncRequested && self.written > self.attempted {
                return self.sync()
            }
            return []
        case .ending(let keep):
            if keep && self.settings.syncs && !self.queued.isEmpty {
                return self.write()
            } else if keep && self.settings.syncs && self.written > self.attempted {
                return self.sync()
            }
            self.phase = .released
            return [.storage(.release(discardSession: !keep))]
        }
    }

    /// At most a batch per trip: storage reports consumption (and credit flows back) sooner.
    private mutating func write() -> [Action] {
        var take = 0
        var bytes = 0
        while take < self.queued.count && (take == 0 || bytes + self.queued[take].payloadLength <= self.settings.batchBytes) {
            bytes += self.queued[take].payloadLength
            take += 1
        }
        let chunks = Array(self.queued.prefix(take))
        self.queued.removeFirst(take)
        self.queuedBytes -= Int64(bytes)
        self.busy = true
        return [.storage(.write(chunks, at: self.written))]
    }

    private mutating func sync() -> [Action] {
        self.syncRequested = false
        var actions: [Action] = []
        if self.timerArmed {
            self.timerArmed = false
            actions.append(.cancelSyncTimer)
        }
        self.busy = true
        self.attempted = self.written
        return actions + [.storage(.sync(through: self.written))]
    }

    /// Leaves the open phase: from here on the key is closing, so a new OPEN of it waits instead of KEY_BUSY.
    private mutating func end(keep: Bool) -> [Action] {
        self.phase = .ending(keep: keep)
        var actions: [Action] = [.markClosing]
        if self.timerArmed {
            self.timerArmed = false
            actions.append(.cancelSyncTimer)
        }
        self.pendingHash = nil
        if !keep { self.dropQueue() }
        return actions
    }

    /// The relay fails the stream: it ends here (so the key is closing before the ERROR goes out), then the
    /// connection writes the ERROR.
    private mutating func fail(_ code: WireErrorCode, _ message: String, keep: Bool) -> [Action] {
        guard self.isOpen else { return [] }
        return self.end(keep: keep) + [.report(.failed(code, message))]
    }

    private mutating func dropQueue() {
        self.queued.removeAll()
        self.queuedBytes = 0
    }
}
