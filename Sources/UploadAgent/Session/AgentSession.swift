import Logging
import NIOCore
import UploadChecksums
import UploadProtocol

/// How one connection ended, for the uploader to decide what next.
struct ConnectionOutcome: Sendable {
    /// Why it ended, for people; nil when every job finished.
    var reason: String?
    /// True when retrying cannot help (bad token, wrong CA, unsupported version).
    var fatal: Bool
    /// True when some item finished or some bytes were acknowledged: the relay is alive.
    var madeProgress: Bool
    /// The code of ``reason`` for scripts (``UploadResult/ErrorCode``, or the wire's); nil for a transient failure.
    var code: String? = nil
    /// True once the relay welcomed the connection.
    var welcomed = false
    /// The relay's answer to the quota plan asked on this connection; nil when none was asked, the relay does not
    /// grant QUOTA_PLAN, or the connection ended before every PLAN was answered.
    var quotaPlan: QuotaPlan? = nil
    /// The connection stays up after its quota plan, idle, for the run that follows to take (``AgentSession/adopt(_:)``).
    var parked = false
}

/// Everything one agent connection decides (SPEC §2 to §6), with no channel, no thread and no clock of its own.
///
/// Inputs are decoded frames, keepalive ticks, the completions of source work and backoff timers, with the time passed
/// in. Outputs are ``Action``s for ``AgentConnectionHandler`` to run. The session owns the connection's state machine
/// (credit reservations included), the frame reader, which jobs stream where, retries and backoff, keepalive, and the
/// connection's outcome. The offset of each stream lives in the state machine alone.
struct AgentSession {
    enum Timer: Hashable {
        /// A job waits out a "not now" (KEY_BUSY, REFUSED_STREAM) before it is opened again.
        case backoff(ObjectIdentifier)
        /// The relay has had ``AgentConfiguration/welcomeTimeout`` to WELCOME the connection.
        case welcome
        /// The relay has had ``AgentSession/progressTimeout`` since its last progress to answer what it owes.
        case progress
        /// Opening paused after many refused OPENs (``refusedOpens``): open again.
        case refusals
    }

    enum Action {
        case write(Frame)
        /// Flush and close the connection.
        case close
        case schedule(Timer, in: TimeAmount)
        /// Open the job's source and, for dedup, hash it (``SourceReader/prepare(_:info:knownSHA1:dedup:reopenLimit:journal:)``); then
        /// call ``prepared(_:_:)``.
        /// With `probe`, a large source is hashed over its first 256 KiB only (SPEC §7.1).
        case prepare(UploadJob, dedup: Bool, probe: Bool)
        /// Read a batch (credit already reserved); then call ``readFinished(_:_:)``.
        case read(SourceReader.Request)
        /// Hash the first `upTo` bytes of the stream's source; then call ``prefixHashed(_:_:)``.
        case hashPrefix(StreamID, any BlobSource, from: (UInt64, SHA1)?, upTo: UInt64, reopening: SourceReader.Reopening)
        case event(UploadEvent)
        case log(Logger.Level, String, Logger.Metadata)
        /// The connection is over: report the outcome to the uploader.
        case finished(ConnectionOutcome)
        /// The quota plan asked on a connection that stays up (``AgentSession/keepAfterPlan``) is answered, or cannot be:
        /// report the outcome to whoever asked; the connection waits, idle, for a run to take it.
        case planned(ConnectionOutcome)
    }

    /// A job streaming on this connection.
    struct Sender {
        var job: UploadJob
        /// The running SHA-1 of the bytes sent, nil when the job knows its SHA-1 already.
        var sha1: SHA1? = nil
        var started = false
        var reading = false
        /// The SHA-1 its HASH carried, once sent.
        var hashedSHA1: SHA1Digest? = nil
        var hashSent: Bool { self.hashedSHA1 != nil }
        /// A striped upload's stream sent stripe 0 and waits for the other stripes (and the SHA-1 of their bytes) before
        /// HASH (SPEC §6.7). It holds no read block meanwhile, and no place of ``AgentConfiguration/concurrency``.
        var waitingForStripes = false
        /// The SHA-1 of the whole source is known for that HASH (hashed on from stripe 0's state, or known before OPEN).
        var wholeSHA1Ready = false
        /// Reads left that send their chunks raw without trying deflate: the last try did not pay (see ``DeflatePolicy``).
        var deflateRest = 0
    }

    /// When a stream tries deflate (SPEC §9): a chunk that deflate did not shrink by a tenth says the data does not
    /// compress (a video, a JPEG), so the next 15 reads go raw and then one tries again. Incompressible data then costs
    /// one compression in 16, not every one (121 MB of logs: 0.7 s plain, 1.7 s deflated on loopback).
    enum DeflatePolicy {
        static let restAfterMiss = 15

        /// Whether `chunk`, sealed with deflate asked, paid for it.
        static func paid(_ chunk: Frame.Chunk) -> Bool {
            guard let raw = chunk.rawLength else { return false }
            return chunk.data.readableBytes * 10 <= Int(raw) * 9
        }
    }

    var machine: AgentConnectionStateMachine
    var reader = FrameReader()
    let configuration: AgentConfiguration
    /// The run's jobs: an empty queue's on a connection that asks a quota plan, then the run's that takes it.
    private(set) var queue: JobQueue
    var senders: [StreamID: Sender] = [:]
    /// Jobs whose source is being opened (and hashed) before OPEN.
    var preparing = 0
    /// Jobs waiting out a backoff before they are opened again.
    var delayed: [ObjectIdentifier: UploadJob] = [:]
    /// Jobs whose content (SHA-1) another stream of this connection is uploading now: they open once it ended, so the
    /// relay's dedup finds it and their bytes never move (the same photo under two names).
    var twins: [UploadJob.ContentKey: [UploadJob]] = [:]
    /// Large files this connection stripes once its striped upload is over: one at a time (SPEC §6.7).
    var deferred: [UploadJob] = []
    var outcome = ConnectionOutcome(reason: nil, fatal: false, madeProgress: false)
    var closed = false
    var deflate = false
    var goingAway = false
    /// Keepalive periods in a row with nothing received (SPEC §2.3).
    var silentPeriods = 0
    /// The last OFFSET, ACK, RESULT or ROOM from the relay (or the connection's start): whatever else arrives, a relay
    /// that owes an answer and gives none for ``progressTimeout`` since then, or since it came to owe one, is left
    /// (SPEC §2.3).
    var lastProgressAt: ContinuousClock.Instant? = nil
    /// The time of the session's first frame: the origin of ``deadline(_:)``.
    var epoch: ContinuousClock.Instant? = nil
    /// When the relay refused this connection's last OPENs (ERROR before OFFSET), the latest ``refusalLimit`` of them:
    /// at that many within a second the agent opens nothing more until the oldest is a second old, well below the
    /// relay's 100 a second (SPEC §12.1), which would end the connection. A full relay refuses each small file at once.
    var refusedOpens: [ContinuousClock.Instant] = []
    var refusalPauseArmed = false
    static let refusalLimit = 50
    /// Since when the relay owes an answer without a break (``awaitsRelay``); nil while it owes none. A stream that
    /// waited minutes for its source and then sent HASH gives the relay its whole time for the RESULT.
    var owedSince: ContinuousClock.Instant? = nil
    /// The quota plan this connection asks before anything else (SPEC §7.2), until every PLAN is answered.
    var planning: QuotaPlanning?
    /// After its quota plan the connection stays up, idle, until a run takes it (``adopt(_:)``) or it is let go: the
    /// uploads that follow the plan save its TCP, TLS and HELLO round trips (four round trips in all with the PLAN, 0.4 s
    /// over 100 ms). Without a plan it waits so once welcomed: a connection opened beside the quota plan's, on a long
    /// link, for the run's first added connections (``Uploader/quotaPlan(_:keepConnection:)``).
    let keepAfterPlan: Bool
    /// The account the relay welcomed the connection as.
    var account: String? = nil
    /// The socket takes more bytes: while it does not (its write buffer is over ``AgentConfiguration/writeBufferBytes``),
    /// no read starts.
    var writable = true
    /// The link's round trip as the kernel measured it when the connection came up (nil: not known).
    var roundTrip: Duration? = nil

    init(configuration: AgentConfiguration, queue: JobQueue, plan: QuotaPlan.Request? = nil, keepAfterPlan: Bool = false) {
        self.configuration = configuration
        self.queue = queue
        self.planning = plan.map(QuotaPlanning.init)
        self.keepAfterPlan = keepAfterPlan
        self.machine = AgentConnectionStateMachine(limits: configuration.limits)
    }

    // MARK: Connection lifecycle

    /// TCP and TLS are up: HELLO. `roundTrip`: the kernel's measure of the link's round trip, when it has one; on a
    /// long link an adaptive run stripes large files (``ConnectionGrowth``).
    mutating func connected(roundTrip: Duration? = nil, now: ContinuousClock.Instant) -> [Action] {
        self.roundTrip = roundTrip
        self.lastProgressAt = now
        let hello = Frame.Hello(
            maxFrameSize: UInt32(self.configuration.limits.maxFrameSize),
            features: self.configuration.deflate ? [.deflate, .dedupProbe, .stripes, .quotaPlan] : [.dedupProbe, .stripes, .quotaPlan],
            credential: Array(self.configuration.token.utf8), agentName: self.configuration.agentName
        )
        return self.write(self.machine.sendHello(hello)) + [
            .schedule(.welcome, in: TimeAmount(self.configuration.welcomeTimeout)),
            .schedule(.progress, in: TimeAmount(self.progressTimeout)),
        ]
    }

    /// How long a relay that owes an answer may give none: `--retry-for`, never less than the welcome timeout (with
    /// `--retry-for 0`, one connection is still given its time).
    var progressTimeout: Duration { max(self.configuration.retryFor, self.configuration.welcomeTimeout) }

    /// Whether the relay owes this connection an answer: a WELCOME, an OFFSET to an OPEN, a RESULT to a HASH, a ROOM
    /// to a PLAN. Bytes that wait for their source (a slow stdin) owe nothing.
    var awaitsRelay: Bool {
        !self.outcome.welcomed || self.planning != nil || self.senders.values.contains { !$0.started || $0.hashSent }
    }

    /// Called after each input: notes when the relay came to owe an answer.
    mutating func noteOwed(now: ContinuousClock.Instant) {
        if !self.awaitsRelay {
            self.owedSince = nil
        } else if self.owedSince == nil {
            self.owedSince = now
        }
    }

    /// The welcome or progress deadline passed: a relay that owes an answer and gave none is left, with the reason.
    mutating func deadlinePassed(_ timer: Timer, now: ContinuousClock.Instant) -> [Action] {
        guard !self.closed else { return [] }
        switch timer {
        case .welcome:
            guard !self.outcome.welcomed else { return [] }
            self.outcome.reason = "the relay did not complete the handshake (WELCOME) within \(self.configuration.welcomeTimeout)"
            return self.close()
        case .progress:
            self.noteOwed(now: now)
            let waited = now - max(self.lastProgressAt ?? now, self.owedSince ?? now)
            let timeout = self.progressTimeout
            if waited >= timeout && self.awaitsRelay {
                self.outcome.reason =
                    self.outcome.welcomed
                    ? "the relay answered nothing (OFFSET, ACK or RESULT) for \(timeout)"
                    : "the relay did not complete the handshake (WELCOME) within \(timeout)"
                return self.close()
            }
            let left = waited >= timeout ? timeout : timeout - waited
            return [.schedule(.progress, in: TimeAmount(max(left, .milliseconds(100))))]
        case .backoff, .refusals:
            return []
        }
    }

    /// Counts a refused OPEN.
    mutating func openRefused(now: ContinuousClock.Instant) {
        self.refusedOpens.append(now)
        if self.refusedOpens.count > Self.refusalLimit { self.refusedOpens.removeFirst() }
    }

    /// Nil while OPENs may go; else the actions of a pause (a timer to open again, armed once).
    mutating func refusalPause(now: ContinuousClock.Instant) -> [Action]? {
        guard self.refusedOpens.count >= Self.refusalLimit, let oldest = self.refusedOpens.first, now - oldest < .seconds(1) else {
            return nil
        }
        guard !self.refusalPauseArmed else { return [] }
        self.refusalPauseArmed = true
        return [.schedule(.refusals, in: TimeAmount(oldest + .seconds(1) - now))]
    }

    /// The socket's write buffer went over its limit (`false`) or drained below half of it (`true`). Reads pause while
    /// it is full, so what the agent holds is a write buffer and a batch per stream, whatever the link's speed: the
    /// relay's credit says what it can take, this says what the link can.
    mutating func writabilityChanged(_ writable: Bool) -> [Action] {
        self.writable = writable
        guard writable else { return [] }
        return self.pumpAll()
    }

    /// Bytes from the relay, decoded by ``nextFrame(now:)``; any bytes prove the link alive.
    mutating func received(_ bytes: ByteBuffer) {
        self.silentPeriods = 0
        self.reader.append(bytes)
    }

    /// Decodes and handles the next whole frame held; nil when there is none (or the connection is closed).
    mutating func nextFrame(now: ContinuousClock.Instant) -> [Action]? {
        guard !self.closed else { return nil }
        let frame: Frame?
        self.reader.maxFrameSize = self.machine.inboundFrameLimit
        do {
            frame = try self.reader.next()
        } catch let error as ProtocolError {
            return self.run(self.machine.decodingFailed(error), now: now)
        } catch {
            return self.run(self.machine.decodingFailed(.connection(.internalError, "\(error)")), now: now)
        }
        guard let frame else { return nil }
        switch frame {
        case .offset, .ack, .result, .room: self.lastProgressAt = now
        default: break
        }
        return self.run(self.machine.receive(frame, now: self.deadline(now)), now: now)
    }

    /// `now` on the state machine's clock (NIO's deadlines, for the PING rate): the time since the session's first
    /// input, so that the session reads no clock of its own and the machine sees the same spacing.
    private mutating func deadline(_ now: ContinuousClock.Instant) -> NIODeadline {
        let epoch = self.epoch ?? now
        self.epoch = epoch
        return .uptimeNanoseconds(0) + TimeAmount(max(.zero, now - epoch))
    }

    /// A keepalive period passed with nothing received (SPEC §2.3): PING once, then take the link for dead.
    mutating func silentPeriod() -> [Action] {
        guard !self.closed else { return [] }
        self.silentPeriods += 1
        if self.silentPeriods >= 2 {
            // Nothing for two periods, even after a PING (or during the TLS handshake): the link is gone.
            self.outcome.reason = "no answer from the relay for \(self.configuration.keepaliveInterval * 2): the link is dead"
            return self.close()
        }
        guard self.machine.terms != nil else { return [] }
        return self.write(.ping(Frame.Ping(data: UInt64.random(in: 0...UInt64.max))))
    }

    /// The transport failed; the first reason is the one reported.
    mutating func transportFailed(_ failure: TransportFailure) -> [Action] {
        if self.outcome.reason == nil {
            switch failure {
            case .handshake(let text, let untrusted):
                self.outcome.reason =
                    untrusted
                    ? "TLS: the relay's certificate does not verify against the CA given (CERTIFICATE_VERIFY_FAILED); pass the CA that signed it with --ca or UPLOAD_CA"
                    : "TLS handshake with the relay failed: \(text)"
                self.outcome.fatal = !self.machine.isClosed && self.machine.terms == nil
                self.outcome.code = untrusted ? UploadResult.ErrorCode.tlsUntrusted : UploadResult.ErrorCode.tlsHandshake
            case .hostnameMismatch(let text):
                // Not transient: retrying cannot change what the certificate names.
                let asked = self.configuration.serverName ?? self.configuration.relayHost
                self.outcome.reason =
                    "TLS: the relay's certificate is not valid for \"\(asked)\" (\(text)); connect by a name or address it holds, pass --server-name NAME with the name it holds, or, for a --dev relay, restart it with --dev-host \(asked)"
                self.outcome.fatal = true
                self.outcome.code = UploadResult.ErrorCode.tlsNameMismatch
            case .tls(let text):
                self.outcome.reason = "TLS error: \(text)"
            case .io(let text):
                self.outcome.reason = "connection lost: \(text)"
            case .other(let text):
                self.outcome.reason = "connection error: \(text)"
            }
        }
        self.closed = true
        return [.close]
    }

    /// The queue changed: a job went back to it or finished (perhaps on an earlier connection), jobs were added or
    /// dropped, or a pause began. Open what waits, stop what was dropped, close when paused or done.
    mutating func jobsChanged() -> [Action] {
        guard !self.closed else { return [] }
        if let reason = self.queue.holdReason {
            // Paused: what the relay acknowledged is durable and resumes later; what it did not is sent again then.
            self.outcome.reason = "paused: \(reason)"
            return self.close()
        }
        var actions: [Action] = []
        for id in self.senders.keys.sorted() {
            if let job = self.senders[id]?.job, let reason = self.queue.dropReason(job) {
                actions += self.failStream(id, reason)
            }
        }
        // A stripe may have ended on another connection.
        for id in self.senders.keys.sorted() where self.senders[id]?.waitingForStripes == true {
            actions += self.hashWhenStriped(id)
        }
        return actions + self.openMore() + self.closeIfIdle()
    }

    /// The channel is gone: every job in flight goes back to the queue for the next connection.
    mutating func connectionClosed() -> [Action] {
        self.closed = true
        for id in self.senders.keys.sorted() {
            guard let sender = self.senders.removeValue(forKey: id) else { continue }
            // Its HASH may have been committed, its RESULT lost with the connection.
            sender.job.hashUndecided(sender.hashedSHA1)
            self.queue.requeue(sender.job)
        }
        for job in self.delayed.values {
            self.queue.requeue(job)
        }
        self.delayed.removeAll()
        for job in self.twins.values.joined() {
            self.queue.requeue(job)
        }
        self.twins.removeAll()
        self.releaseDeferred()
        if self.outcome.reason == nil && !self.queue.isDone {
            self.outcome.reason = "the relay closed the connection"
        }
        return [.finished(self.outcome)]
    }

    // MARK: The state machine's actions

    mutating func run(_ action: AgentAction, now: ContinuousClock.Instant) -> [Action] {
        switch action {
        case .none:
            return []
        case .connected(let welcome):
            self.outcome.welcomed = true
            self.deflate = welcome.features.contains(.deflate)
            self.account = welcome.account
            let plan = self.planning == nil && self.keepAfterPlan ? self.planOver() : self.askPlan()
            return [self.connectedEvent(welcome.account)] + plan + self.openMore()
        case .offset(let offset):
            return self.receivedOffset(offset)
        case .acknowledged(let id, let offset):
            guard let sender = self.senders[id] else { return [] }
            guard sender.job.stripe == nil else {
                // A stripe's offsets are its own: nothing of the source is released by them.
                self.outcome.madeProgress = true
                return self.pump(id)
            }
            sender.job.acknowledge(offset)
            // The relay holds bytes of this try: an earlier refusal is no longer why a later failure happens.
            sender.job.lastRefusal = nil
            self.queue.acknowledged(sender.job)
            self.outcome.madeProgress = true
            return [.event(.acknowledged(key: sender.job.key, offset: offset))] + self.pump(id)
        case .creditGranted(let id):
            if id.isConnection {
                return self.pumpAll()
            }
            return self.pump(id)
        case .completed(let result):
            guard let sender = self.senders.removeValue(forKey: result.streamID) else { return [] }
            if sender.job.stripe != nil { return self.stripeEnded(sender.job, failure: nil) }
            return self.complete(sender.job, sender.job.finish(.stored, sha1: result.sha1.hex))
        case .streamFailed(let id, let code, let message):
            return self.streamFailed(id, code, message, now: now)
        case .send(let frame):
            return self.write(frame)
        case .resetStream(let error):
            return self.write(.error(error)) + self.streamFailed(error.streamID, error.code, "agent reset the stream: \(error.message)", now: now)
        case .closeConnection(let error):
            self.outcome.reason = "the relay broke the protocol: \(error.message)"
            return self.write(.error(error)) + self.close()
        case .peerClosed(let code, let message):
            self.outcome.reason = "relay closed the connection: \(code.name): \(message)"
            self.outcome.fatal = code == .unauthenticated || code == .unsupportedVersion
            self.outcome.code = code.name
            return self.close()
        case .room(let room):
            return self.planAnswered(room)
        case .goingAway(let goAway):
            self.outcome.reason = "the relay is going away: \(goAway.message)"
            self.goingAway = true
            for id in self.senders.keys.sorted() where id > goAway.lastStreamID {
                if let sender = self.senders.removeValue(forKey: id) { self.queue.requeue(sender.job) }
            }
            // They would open here only after this connection's striped upload: another connection takes them.
            self.releaseDeferred()
            return self.closeIfIdle()
        }
    }

    func connectedEvent(_ account: String) -> Action {
        .event(.connected(relay: "\(self.configuration.relayHost):\(self.configuration.relayPort)", account: account))
    }

    /// The quota plan is over (answered, or the relay answers none; or none was asked of a kept connection, welcomed):
    /// the connection closes, or, kept, waits for a run.
    mutating func planOver() -> [Action] {
        guard self.keepAfterPlan, !self.closed else { return self.closeIfIdle() }
        self.outcome.parked = true
        return [.planned(self.outcome)]
    }

    /// A run takes this connection, kept after its quota plan: its jobs are `queue`'s from now on, and its outcome is
    /// the run's. Nothing was opened here before (the plan's queue is empty).
    mutating func adopt(_ queue: JobQueue) -> [Action] {
        guard self.outcome.parked, !self.closed, let account = self.account else { return [] }
        self.queue = queue
        self.outcome = ConnectionOutcome(reason: nil, fatal: false, madeProgress: false, welcomed: true)
        return [self.connectedEvent(account)] + self.openMore() + self.closeIfIdle()
    }

    // MARK: Writing and closing

    func write(_ frame: Frame) -> [Action] {
        self.closed ? [] : [.write(frame)]
    }

    mutating func close() -> [Action] {
        guard !self.closed else { return [] }
        self.closed = true
        return [.close]
    }

    /// Closes once nothing is in flight and nothing more will go out on this connection.
    mutating func closeIfIdle() -> [Action] {
        self.releaseTwins()
        guard self.senders.isEmpty, self.preparing == 0, self.delayed.isEmpty, self.twins.isEmpty, self.deferred.isEmpty, self.planning == nil,
            !self.outcome.parked
        else { return [] }
        // A connection whose stream ids are all used closes once idle: the next connection carries the rest.
        return self.queue.isDone || self.goingAway || self.machine.streamIDsExhausted ? self.close() : []
    }
}
