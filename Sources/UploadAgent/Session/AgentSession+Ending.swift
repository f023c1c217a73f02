import Logging
import NIOCore
import UploadChecksums
import UploadProtocol

/// How a stream ends: its failure, a retry or a wait for room, its timers, its result.
extension AgentSession {
    /// Gives up on one upload for a reason of the agent's own (its source failed or changed): CANCEL, and report it.
    mutating func failStream(_ id: StreamID, _ message: String) -> [Action] {
        var actions: [Action] = []
        if let cancel = self.machine.sendCancel(id, .cancelled, message) {
            actions += self.write(cancel)
        }
        if let sender = self.senders.removeValue(forKey: id) {
            let job = sender.job
            if !job.item.source.isSeekable, let refusal = job.lastRefusal {
                // A stream cannot be sent again from the offset the relay asks after its own failure (its storage full,
                // say): that failure is the item's result, with what it cost.
                let error = "relay refused \"\(job.key)\": \(refusal.code.name): \(refusal.message); retried, but \(message)"
                actions += self.complete(job, job.finish(.failed, sha1: "", error: error, code: refusal.code.name))
            } else {
                actions += self.complete(job, job.finish(.failed, sha1: "", error: message, code: UploadResult.ErrorCode.sourceError))
            }
        }
        return actions + self.pumpAll()
    }

    /// The relay ended a stream with an error: retry (at once, or after a backoff for "not now"), or give the job up.
    mutating func streamFailed(_ id: StreamID, _ code: WireErrorCode, _ message: String, now: ContinuousClock.Instant) -> [Action] {
        guard let sender = self.senders.removeValue(forKey: id) else { return [] }
        let job = sender.job
        if !sender.started { self.openRefused(now: now) }
        job.lastError = "\(code.name): \(message)"
        job.lastRefusal = (code, message)
        job.hashUndecided(sender.hashedSHA1)
        // No room on the relay for this item: the account's quota (which a long-running agent waits out), or the relay's
        // storage, full or failing (which passes). The item waits on its own, longer each time, while the others go on:
        // a smaller file may fit where this one does not (SPEC §7). A stripe's STORAGE_ERROR says its upload is gone
        // (SPEC §6.7) instead.
        let noRoom = (code == .quotaExceeded || code == .storageError) && job.stripe == nil
        if noRoom && (self.configuration.retryForever || code == .storageError) {
            job.noRoomRetries += 1
            let since = job.noRoomSince ?? now
            job.noRoomSince = since
            if self.configuration.retryForever || now - since < self.configuration.retryFor {
                let (initial, maximum) =
                    self.configuration.retryForever
                    ? (self.configuration.relayFullBackoff, self.configuration.relayFullMaxBackoff)
                    : (self.configuration.storageRetryBackoff, self.configuration.storageRetryMaxBackoff)
                var wait = initial
                for _ in 1..<min(job.noRoomRetries, 30) where wait < maximum { wait *= 2 }
                wait = min(wait, maximum)
                let reason = "\(code.name): \(message)"
                if job.item.source.isSeekable {
                    // It may wait for minutes, and every queued file may: none holds its descriptor or a read block
                    // meanwhile. It is opened again, and its fingerprint checked, when its turn comes.
                    job.item.source.close()
                    job.info = nil
                    job.knownSHA1 = nil
                    job.probe = nil
                    job.probePrefix = nil
                }
                self.queue.deferJob(job, for: wait, reason: reason)
                return [.event(.waiting(key: job.key, reason: reason, retryIn: wait))] + self.openMore() + self.pumpAll() + self.closeIfIdle()
            }
        }
        // KEY_BUSY and REFUSED_STREAM say "not now" (SPEC §11): they are retried for --retry-for, not counted as attempts.
        let busy = code == .keyBusy || code == .refusedStream
        if busy {
            job.busySince = job.busySince ?? now
        } else {
            job.attempts += 1
        }
        // Another upload of the same key (the same files sent twice at once) may take long: KEY_BUSY waits ten times
        // --retry-for; a full relay (REFUSED_STREAM) waits --retry-for.
        let patience = code == .keyBusy ? self.configuration.retryFor * 10 : self.configuration.retryFor
        // A long-running agent waits out "not now" however long it lasts: an account past its share of the relay's
        // upload slots is refused until its own uploads end.
        let retry =
            busy
            ? self.configuration.retryForever || now - (job.busySince ?? now) < patience
            : code.isRetryable && job.attempts < self.configuration.maxAttemptsPerItem
        guard retry else {
            let result = job.finish(
                .failed, sha1: job.knownSHA1?.hex ?? "", error: "relay refused \"\(job.key)\": \(code.name): \(message)", code: code.name
            )
            return self.complete(job, result)
        }
        var actions: [Action] = [.log(.info, "retrying", ["upload.key": "\(job.key)", "error": "\(job.lastError ?? "")"])]
        if busy {
            // The relay is closing an earlier upload of this key, or is full: wait a little, longer each time.
            job.busyRetries += 1
            self.delayed[ObjectIdentifier(job)] = job
            actions.append(.schedule(.backoff(ObjectIdentifier(job)), in: .milliseconds(min(2_000, 50 * Int64(job.busyRetries)))))
        } else {
            self.queue.requeue(job)
        }
        // Its read place, if it held one, is free.
        return actions + self.openMore() + self.pumpAll() + self.closeIfIdle()
    }

    mutating func timerFired(_ timer: Timer, now: ContinuousClock.Instant) -> [Action] {
        switch timer {
        case .backoff(let id):
            guard let job = self.delayed.removeValue(forKey: id) else { return [] }
            self.queue.requeue(job)
            return self.openMore() + self.closeIfIdle()
        case .welcome, .progress:
            return self.deadlinePassed(timer, now: now)
        case .refusals:
            self.refusalPauseArmed = false
            return self.openMore() + self.closeIfIdle()
        }
    }

    mutating func complete(_ job: UploadJob, _ result: UploadResult) -> [Action] {
        if job.stripe != nil {
            return self.stripeEnded(job, failure: result.status == .failed ? result.error ?? "failed" : nil)
        }
        self.outcome.madeProgress = true
        self.queue.finished(job, result)
        // The same content is on the relay now (or failed): the twins open (``openMore()`` releases them), and its
        // dedup answers them (a probe's twin through CONFIRM).
        return [.event(.finished(result))] + self.openMore() + self.closeIfIdle()
    }
}
