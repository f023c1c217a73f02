import Logging
import NIOCore
import UploadChecksums
import UploadProtocol

/// Jobs on streams: preparing, opening, reading within credit, HASH (their ends: AgentSession+Ending, stripes:
/// AgentSession+Stripes).
extension AgentSession {
    /// Whether a large file goes in stripes over the run's connections (SPEC §6.7): with a fixed number above one, or in
    /// an adaptive run on a long link, where more connections are opened to carry them (``ConnectionGrowth``).
    var stripesAcrossConnections: Bool {
        guard self.configuration.connections > 1 else { return false }
        guard self.configuration.adaptiveConnections else { return true }
        return (self.roundTrip ?? .zero) >= ConnectionGrowth.longLink
    }

    // MARK: Opening

    /// Opens streams while the relay allows more, places of ``AgentConfiguration/concurrency`` are free and jobs wait.
    /// Twins whose content no stream of this connection uploads any more go back to the queue: the stream ended, or
    /// its job went back to the queue (another connection may take it), or learnt its SHA-1 since (a probe's). Never
    /// left waiting for an upload that is not here: the connection would not close, the run not end.
    mutating func releaseTwins() {
        guard !self.twins.isEmpty else { return }
        let uploading = Set(self.senders.values.flatMap { $0.job.contentKeys })
        for (content, jobs) in self.twins where !uploading.contains(content) {
            self.twins[content] = nil
            for job in jobs { self.queue.requeue(job) }
        }
    }

    mutating func openMore() -> [Action] {
        self.releaseTwins()
        guard !self.closed else { return [] }
        if let paused = self.refusalPause(now: .now) { return paused }
        if !self.deferred.isEmpty && !self.senders.values.contains(where: { $0.job.striped }) {
            // The striped upload they waited for left this connection (finished, failed, confirmed, retried).
            self.releaseDeferred()
        }
        var actions: [Action] = []
        let perSlot = max(1, self.configuration.smallUploadsPerSlot)
        let budget = max(1, self.configuration.concurrency) * perSlot
        // A job being prepared takes a whole place until its size is known. One whose HASH went out takes none: it holds
        // no read block, and only waits for the relay's commit (the relay's stream limit bounds how many do).
        var used = self.senders.values.reduce(self.preparing * perSlot) {
            $0 + ($1.hashSent || $1.waitingForStripes ? 0 : self.shares(of: $1.job))
        }
        while self.machine.canOpenStream, used + perSlot <= budget, !self.holdsEnoughBytes, let job = self.queue.next() {
            if job.stripe != nil {
                // A PART job needs no preparing: its source is the main job's, open already (SPEC §6.7).
                let opened = self.openStripe(job)
                if !opened.isEmpty { used += perSlot }
                actions += opened
                continue
            }
            self.preparing += 1
            used += perSlot
            let dedup = job.item.dedup ?? self.configuration.dedup
            let probing = dedup && !job.probeConfirmed && self.machine.features.contains(.dedupProbe)
            // With the probe, a job that made progress in an earlier run asks nothing before OPEN: its session is on the
            // relay, and hashing it first (whole or probe) would re-read what the resume does not need.
            let resuming = job.recorded != nil || !job.resumeToken.isEmpty
            actions.append(.prepare(job, dedup: dedup && !(probing && resuming), probe: probing && !resuming))
        }
        return actions
    }

    /// What one connection of an adaptive run on a long link holds to send before it takes another job: about what it
    /// carries per round trip (Linux's default socket buffer). The next upload opens while this one's last bytes go,
    /// so the window stays busy across the round trips between two uploads, and the rest of the queue stays for the
    /// connections the run opens: five 16 MiB files taken at once by the first connection, sharing its one window
    /// while the others idled, made the run wait for that tail.
    static let balancedBytes: UInt64 = 4 << 20

    /// An adaptive run on a long link: a connection takes jobs by the bytes it holds to send (``holdsEnoughBytes``).
    var balancesBytes: Bool { self.configuration.adaptiveConnections && self.stripesAcrossConnections }

    /// Whether this connection holds ``balancedBytes`` or more to send (a job being prepared counting as that much), on
    /// an adaptive run's long link; never otherwise.
    var holdsEnoughBytes: Bool {
        guard self.balancesBytes else { return false }
        var unsent = UInt64(self.preparing) * Self.balancedBytes
        for (id, sender) in self.senders where !sender.hashSent && !sender.waitingForStripes {
            // A stream of unknown length (stdin) counts nothing: it may idle for a long time, and the connection goes on
            // taking the files beside it meanwhile.
            guard let length = sender.job.streamLength else { continue }
            unsent += length - min(length, self.machine.nextOffset(on: id) ?? 0)
            if unsent >= Self.balancedBytes { return true }
        }
        return unsent >= Self.balancedBytes
    }

    /// The shares of ``AgentConfiguration/concurrency`` an opened job takes: one when it is small, a whole place otherwise.
    func shares(of job: UploadJob) -> Int {
        let perSlot = max(1, self.configuration.smallUploadsPerSlot)
        guard let size = job.info?.size, size <= self.configuration.smallUploadBytes else { return perSlot }
        return 1
    }

    /// The job's source is open (and hashed, for dedup): OPEN, or the job failed.
    mutating func prepared(_ job: UploadJob, _ result: Result<SourceReader.Prepared, any Error>) -> [Action] {
        self.preparing -= 1
        switch result {
        case .success(let prepared):
            let info = prepared.info
            let sha1 = prepared.sha1 ?? job.undecided.flatMap { $0.fingerprint == info.fingerprint ? $0.sha1 : nil }
            if let expected = job.item.checkedFingerprint, expected != info.fingerprint, job.stripe == nil {
                // Not the file that was named or queued (another one at the path now, or it changed since): never sent
                // in its place.
                job.item.source.close()
                let message =
                    "\(job.item.source.displayName) is not the file that was queued: it changed or was replaced since; not uploaded (send it again to upload it as it is now)"
                return self.complete(job, job.finish(.failed, sha1: "", error: message, code: UploadResult.ErrorCode.sourceError))
            }
            job.info = info
            job.knownSHA1 = sha1
            job.hashedBytes += prepared.hashedBytes
            if job.stripe == nil { job.heldContent = prepared.content }
            if let recorded = job.recorded, recorded.fingerprint == info.fingerprint, sha1 == nil {
                // The state database kept the SHA-1 state at the durable offset of an earlier run: no re-read.
                job.snapshots[recorded.offset] = recorded.state
            }
            job.recorded = nil
            self.queue.progressed(job)
            if let reason = self.queue.dropReason(job) {
                return self.complete(job, job.finish(.failed, sha1: "", error: reason))
            }
            guard !self.closed, self.machine.canOpenStream else {
                self.queue.requeue(job)
                return self.closeIfIdle()
            }
            job.probe = sha1 == nil ? prepared.probe : nil
            job.probePrefix = sha1 == nil ? prepared.probePrefix : nil
            if let content = job.contentKey, self.senders.values.contains(where: { $0.job.contentKeys.contains(content) }) {
                self.twins[content, default: []].append(job)
                return []
            }
            let id = self.machine.nextStreamID
            // With several connections (an adaptive run's on a long link) a large file goes in stripes, one stream each, on whichever connection is free:
            // one TCP connection is held to its window per round trip (SPEC §6.7). Whether a file is striped depends on
            // the file, the agent's connections and the relay alone, never on what else runs: a resumed session whose
            // striping differs is discarded, and its bytes sent again. A main stream waits for its
            // stripes holding a stream, and mains in every stream a relay allows would wait for stripes that can never
            // open (a directory of large videos): one striped upload per connection at a time, the next waits for it
            // while the connection carries other files, and only where the relay allows a stream beside it.
            let stripable =
                self.stripesAcrossConnections && self.machine.features.contains(.stripes) && job.item.source.isSeekable
                && (self.machine.terms?.maxStreams ?? 0) >= 2 && info.size.map { $0 > Frame.Stripes(size: $0).length } ?? false
            if stripable && self.senders.values.contains(where: { $0.job.striped }) {
                self.deferred.append(job)
                return []
            }
            job.striped = stripable
            let open = Frame.Open(
                streamID: id, key: job.key, size: info.size, sha1: sha1, overwrite: job.item.overwrite ?? self.configuration.overwrite,
                fingerprint: info.fingerprint, resumeToken: job.resumeToken, probe: job.probe, striped: job.striped
            )
            guard let frame = self.machine.sendOpen(open) else {
                self.queue.requeue(job)
                return []
            }
            self.senders[id] = Sender(job: job)
            return self.write(frame)
        case .failure(let error):
            return self.complete(job, job.finish(.failed, sha1: "", error: "\(error)", code: UploadResult.ErrorCode.sourceError))
        }
    }

    /// OFFSET: STORED ends the job; START and RESUME begin sending at the relay's offset.
    mutating func receivedOffset(_ offset: Frame.Offset) -> [Action] {
        let id = offset.streamID
        guard var sender = self.senders[id] else { return [] }
        let job = sender.job
        if job.stripe != nil {
            guard offset.disposition != .stored else {
                self.senders[id] = nil
                return self.stripeEnded(job, failure: nil)
            }
            sender.started = true
            self.senders[id] = sender
            return self.pump(id)
        }
        job.resumeToken = offset.resumeToken
        if offset.disposition == .stored {
            self.senders[id] = nil
            if let sha1 = job.knownSHA1, job.undecided?.sha1 == sha1 {
                return self.complete(job, job.finish(.stored, sha1: sha1.hex))
            }
            return self.complete(job, job.finish(.deduplicated, sha1: job.knownSHA1?.hex ?? ""))
        }
        if offset.disposition == .confirm {
            // The relay may hold these bytes (SPEC §7.1): hash the whole source, then OPEN again with its SHA-1.
            self.senders[id] = nil
            job.probeConfirmed = true
            self.queue.requeue(job)
            return self.openMore() + self.closeIfIdle()
        }
        job.busySince = nil
        job.busyRetries = 0
        // The latest SHA-1 state at or below the relay's offset: kept by this run, or by the state database's record.
        let base = job.knownSHA1 == nil ? job.snapshots.filter { $0.key <= offset.offset }.max { $0.key < $1.key } : nil
        job.acknowledge(offset.offset)
        // Every way on from here sends stripe 0 first (a resume hashes its prefix before): the stripes go out meanwhile.
        let started = [Action.event(.started(key: job.key, size: job.info?.size, offset: offset.offset))] + self.spawnStripes(job)
        if job.knownSHA1 == nil {
            if offset.offset == 0 {
                sender.sha1 = job.probePrefix ?? SHA1()
            } else if let base, base.key == offset.offset {
                sender.sha1 = base.value
            } else if job.item.source.isSeekable {
                // The relay knows bytes this run never sent (the agent restarted): hash them locally, no network, from
                // the latest SHA-1 state kept below them. The recorded progress stays as it is until that is done.
                job.hashedBytes += offset.offset - (base?.key ?? 0)
                sender.reading = true
                self.senders[id] = sender
                return started + [
                    .hashPrefix(id, job.item.source, from: base.map { ($0.key, $0.value) }, upTo: offset.offset, reopening: self.reopening(job))
                ]
            } else {
                return started
                    + self.failStream(id, "\(job.item.source.displayName) cannot resume at \(offset.offset): those bytes are no longer held")
            }
        }
        self.queue.progressed(job)
        sender.started = true
        self.senders[id] = sender
        return started + self.pump(id)
    }

    /// A prefix hash ended. It took one of the reads in flight: the other streams go on in turn, or one that wanted to
    /// read meanwhile would wait for an event that may never come (a stripe gets no ACK).
    mutating func prefixHashed(_ id: StreamID, _ result: Result<SHA1, any Error>) -> [Action] {
        guard var sender = self.senders[id] else { return self.pumpAll() }
        sender.reading = false
        switch result {
        case .success(let sha1) where sender.waitingForStripes:
            // The stripes' bytes hashed on from stripe 0's state: the whole source's SHA-1.
            sender.sha1 = sha1
            sender.wholeSHA1Ready = true
            self.senders[id] = sender
            return self.hashWhenStriped(id) + self.pumpInTurn(after: id, again: false)
        case .success(let sha1):
            sender.sha1 = sha1
            sender.job.snapshots[sender.job.acked] = sha1
            self.queue.progressed(sender.job)
            sender.started = true
            self.senders[id] = sender
            return self.pumpInTurn(after: id, again: true)
        case .failure(let error):
            self.senders[id] = sender
            return self.failStream(id, "\(error)") + self.pumpInTurn(after: id, again: false)
        }
    }

    // MARK: Sending

    /// Reads as much as credit allows, then HASH at the end. Each read first reserves its credit in the state machine,
    /// so reads of several streams planned at once never count on the same bytes.
    mutating func pump(_ id: StreamID) -> [Action] {
        var reads = self.readsInFlight
        return self.pump(id, reads: &reads)
    }

    /// ``pump(_:)`` with the reads in flight counted by the caller, and counted on when this one reads: a turn over
    /// every stream counts them once, not once per stream (that walk was the most of the agent's own CPU per small
    /// file but hashing).
    private mutating func pump(_ id: StreamID, reads: inout Int) -> [Action] {
        guard !self.closed, self.writable, reads < max(1, self.configuration.maxReadsInFlight),
            var sender = self.senders[id], sender.started, !sender.reading, !sender.hashSent,
            let offset = self.machine.nextOffset(on: id)
        else { return [] }
        let job = sender.job
        let size = job.streamLength
        let atEnd = size.map { offset >= $0 } ?? false
        // Small batches keep reading here overlapped with the relay's work on the previous batch.
        let batch = max(1, self.configuration.readBatchBytes)
        let wanted = size.map { Int(clamping: min(UInt64(batch), $0 - min(offset, $0))) } ?? batch
        let budget = atEnd ? 0 : self.machine.reserveCredit(on: id, upTo: wanted)
        guard budget > 0 || atEnd else { return [] }
        sender.reading = true
        reads += 1
        let deflate = self.deflate && sender.deflateRest == 0
        if self.deflate && !deflate { sender.deflateRest -= 1 }
        self.senders[id] = sender
        let request = SourceReader.Request(
            streamID: id, source: job.item.source, size: size, offset: offset, budget: budget,
            chunkSize: max(1, min(self.configuration.chunkSize, self.machine.maxChunkPayload)), deflate: deflate,
            sha1: sender.sha1, keepSnapshots: job.knownSHA1 == nil && job.stripe == nil, reopening: self.reopening(job),
            corruptAt: self.configuration.faults.corruptChunkAtOffset,
            base: job.stripe.map { $0.set.stripes.start(of: $0.index) } ?? 0,
            held: job.stripe == nil && !job.striped ? job.heldContent : nil
        )
        return [.read(request)]
    }

    /// Reads (and prefix hashes) of this connection on the thread pool now.
    var readsInFlight: Int {
        self.senders.values.reduce(0) { $0 + ($1.reading ? 1 : 0) }
    }

    /// Every stream in order of its id (more credit for the connection, the socket drained).
    mutating func pumpAll() -> [Action] {
        self.pump(self.senders.keys.sorted())
    }

    /// A read ended and its place is free: the streams after `id` in turn, then `id` itself if `again`, so that no
    /// stream keeps the places to itself.
    mutating func pumpInTurn(after id: StreamID, again: Bool) -> [Action] {
        let ids = self.senders.keys.sorted()
        return self.pump(ids.filter { $0 > id } + ids.filter { $0 < id } + (again ? [id] : []))
    }

    /// Pumps `ids` in order until the places for reads are taken.
    private mutating func pump(_ ids: [StreamID]) -> [Action] {
        var reads = self.readsInFlight
        var actions: [Action] = []
        for id in ids {
            guard reads < max(1, self.configuration.maxReadsInFlight) else { break }
            actions += self.pump(id, reads: &reads)
        }
        return actions
    }

    /// How reads of the job's source recover when it becomes invalid: the fingerprint it was opened with must hold.
    func reopening(_ job: UploadJob) -> SourceReader.Reopening {
        SourceReader.Reopening(fingerprint: job.info?.fingerprint ?? [], limit: self.configuration.maxReopensInARow)
    }

    /// A read finished: its chunks go out within the reservation, the rest of which is given back; HASH at the end.
    mutating func readFinished(_ id: StreamID, _ result: Result<SourceReader.Batch, any Error>) -> [Action] {
        // A stream that ended while its read ran gave its read place back: the others go on (a stripe gets no ACK that
        // would wake it).
        guard var sender = self.senders[id], !self.closed else { return self.closed ? [] : self.pumpAll() }
        sender.reading = false
        let job = sender.job
        switch result {
        case .success(let batch):
            sender.sha1 = batch.sha1
            if batch.deflateTried, batch.chunks.contains(where: { !DeflatePolicy.paid($0) }) {
                sender.deflateRest = DeflatePolicy.restAfterMiss
            }
            self.senders[id] = sender
            for (offset, sha1) in batch.snapshots {
                job.snapshots[offset] = sha1
            }
            // A stripe's bytes count for the item its main job reports.
            let owner = job.stripe?.main ?? job
            var actions: [Action] = []
            for chunk in batch.chunks {
                switch self.machine.sendChunk(chunk) {
                case .send(let frame):
                    owner.sentBytes += UInt64(chunk.payloadLength)
                    owner.wireBytes += UInt64(chunk.data.readableBytes)
                    actions += self.write(frame)
                    actions.append(.event(.sent(key: job.key, bytes: chunk.payloadLength)))
                case .streamGone:
                    self.machine.releaseReservation(on: id)
                    return actions
                case .refused(let reason):
                    self.machine.releaseReservation(on: id)
                    return actions + self.failStream(id, "agent bug, upload stopped: \(reason)")
                }
            }
            // What the read did not use goes back before the next read reserves again.
            self.machine.releaseReservation(on: id)
            if batch.ended {
                let end = job.striped ? self.stripeZeroSent(id) : self.sendHash(id, size: batch.nextOffset)
                return actions + end + self.pumpInTurn(after: id, again: false) + self.openMore()
            }
            // An empty batch that did not end: a stream source waits for ACKs to free room; they pump it again. A
            // connection that balances bytes may take the next job now that these went out.
            return actions + self.pumpInTurn(after: id, again: !batch.chunks.isEmpty) + (self.balancesBytes ? self.openMore() : [])
        case .failure(let error):
            self.senders[id] = sender
            return self.failStream(id, "\(error)") + self.pumpInTurn(after: id, again: false)
        }
    }

    mutating func sendHash(_ id: StreamID, size: UInt64) -> [Action] {
        guard var sender = self.senders[id],
            let digest = sender.job.stripe != nil
                ? Self.noDigest : sender.job.knownSHA1 ?? sender.sha1.flatMap({ SHA1Digest(bytes: $0.finalize()) })
        else {
            return []
        }
        sender.hashedSHA1 = digest
        self.senders[id] = sender
        sender.job.bytesRead = size
        switch self.machine.sendHash(Frame.Hash(streamID: id, size: size, sha1: self.configuration.faults.lieAboutSHA1 ?? digest)) {
        case .send(let frame):
            return self.write(frame)
        case .streamGone:
            return []
        case .refused(let reason):
            return self.failStream(id, "agent bug, upload stopped: \(reason)")
        }
    }
}
