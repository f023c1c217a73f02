import Logging
import NIOCore
import UploadChecksums
import UploadProtocol

/// A striped upload (SPEC §6.7): its PART streams, on any connection, and the main stream's HASH once every stripe is in.
extension AgentSession {
    /// The SHA-1 field of a PART stream's HASH: the relay does not check it.
    static let noDigest = SHA1Digest(bytes: [UInt8](repeating: 0, count: SHA1Digest.size))!

    /// Opens a PART job's stream, or drops the job when its stripe is no longer wanted (complete, its upload failed or
    /// started over under another token). Empty when nothing was opened.
    mutating func openStripe(_ job: UploadJob) -> [Action] {
        guard let stripe = job.stripe, let size = job.info?.size else { return [] }
        guard self.machine.features.contains(.stripes) else {
            // A relay behind the same address without stripes (a mixed rollout): this stripe cannot go here.
            stripe.set.fail("stripe \(stripe.index): a relay connection without STRIPES")
            self.queue.finishedStripe(job)
            return []
        }
        if stripe.set.isComplete(stripe.index) || stripe.set.failure != nil || stripe.main.stripes !== stripe.set
            || stripe.main.result != nil || self.queue.dropReason(job) != nil
        {
            self.queue.finishedStripe(job)
            return []
        }
        let id = self.machine.nextStreamID
        let open = Frame.Open(streamID: id, key: job.key, size: size, resumeToken: stripe.set.token, part: UInt32(stripe.index))
        guard let frame = self.machine.sendOpen(open) else {
            self.queue.requeue(job)
            return []
        }
        self.senders[id] = Sender(job: job)
        return self.write(frame)
    }

    /// A striped upload's OFFSET named it: its stripes go to the queue, for every connection to send (once per upload:
    /// a main stream that resumes under the same token finds them there, in flight or complete).
    mutating func spawnStripes(_ job: UploadJob) -> [Action] {
        guard job.striped, let size = job.info?.size, !job.resumeToken.isEmpty else { return [] }
        if let set = job.stripes, set.token == job.resumeToken, set.failure == nil { return [] }
        let set = StripeSet(token: job.resumeToken, size: size)
        job.stripes = set
        self.queue.addStripes((1..<set.stripes.count).map { UploadJob(stripe: $0, of: job, set: set) })
        return [.log(.debug, "striped upload", ["upload.key": "\(job.key)", "stripes": "\(set.stripes.count)"])]
    }

    /// Stripe 0 is sent: HASH waits for the other stripes and for the SHA-1 of their bytes, hashed on from stripe 0's
    /// state while they travel (or known before OPEN).
    mutating func stripeZeroSent(_ id: StreamID) -> [Action] {
        guard var sender = self.senders[id], let size = sender.job.info?.size else { return [] }
        sender.waitingForStripes = true
        if sender.job.knownSHA1 != nil {
            sender.wholeSHA1Ready = true
            self.senders[id] = sender
            return self.hashWhenStriped(id)
        }
        guard let sha1 = sender.sha1 else {
            self.senders[id] = sender
            return self.failStream(id, "agent bug, upload stopped: no SHA-1 state after stripe 0")
        }
        sender.reading = true
        self.senders[id] = sender
        let job = sender.job
        return [.hashPrefix(id, job.item.source, from: (sha1.byteCount, sha1), upTo: size, reopening: self.reopening(job))]
    }

    /// HASH for a striped upload once every stripe is complete and the whole SHA-1 is known; the upload fails when a
    /// stripe was given up.
    mutating func hashWhenStriped(_ id: StreamID) -> [Action] {
        guard var sender = self.senders[id], sender.waitingForStripes, let size = sender.job.info?.size else { return [] }
        if let failure = sender.job.stripes?.failure {
            return self.failStream(id, "a stripe of \"\(sender.job.key)\" failed: \(failure)")
        }
        guard sender.wholeSHA1Ready, sender.job.stripes?.allComplete == true else { return [] }
        sender.waitingForStripes = false
        sender.reading = false
        self.senders[id] = sender
        return self.sendHash(id, size: size)
    }

    /// This connection's striped upload left it: the large files that waited for it go back to the queue.
    mutating func releaseDeferred() {
        for job in self.deferred { self.queue.requeue(job) }
        self.deferred.removeAll()
    }

    /// A PART job ended: its stripe complete (`failure` nil) or given up. The connections hear it through the queue.
    mutating func stripeEnded(_ job: UploadJob, failure: String?) -> [Action] {
        guard let stripe = job.stripe else { return [] }
        self.outcome.madeProgress = true
        if let failure {
            stripe.set.fail("stripe \(stripe.index): \(failure)")
        } else {
            stripe.set.complete(stripe.index)
        }
        self.queue.finishedStripe(job)
        return self.openMore() + self.closeIfIdle()
    }
}
