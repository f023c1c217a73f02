import Logging
import NIOCore
import UploadProtocol

/// The connection's lifecycle: TLS, reading, timers, authentication, liveness.
extension RelaySession {
    // MARK: Connection lifecycle

    /// The connection was accepted: the handshake and liveness clocks start.
    package mutating func started(now: NIODeadline) -> [Action] {
        self.lastFrameAt = now
        return self.scheduleLiveness(now: now) + [.schedule(.handshake, in: TimeAmount(self.limits.handshakeTimeout))]
    }

    /// TLS is up: only agents that asked for this protocol are served (SPEC §2.1); no frame is read or written otherwise.
    package mutating func tlsHandshakeCompleted(alpn: String?, now: NIODeadline) -> [Action] {
        guard alpn == ProtocolLimits.alpn else {
            let log = Action.log(.info, "closing connection: TLS did not select ALPN \(ProtocolLimits.alpn)", ["alpn": "\(alpn ?? "none")"])
            return [log] + self.close()
        }
        self.alpnAccepted = true
        self.lastFrameAt = now
        return []
    }

    /// Bytes from the network, decoded by ``nextFrame(now:)``.
    package mutating func received(_ bytes: ByteBuffer) {
        guard self.alpnAccepted, !self.closed else { return }
        self.reader.append(bytes)
    }

    /// Decodes and handles the next whole frame held; nil when there is none (or the connection is closed). The handler
    /// calls it only while the connection can take the answers: a peer that does not read what the relay writes is not
    /// read either: a peer that never reads cannot make the relay buffer answers without bound.
    package mutating func nextFrame(now: NIODeadline) -> [Action]? {
        guard self.alpnAccepted, !self.closed else { return nil }
        let frame: Frame?
        self.reader.maxFrameSize = self.machine.inboundFrameLimit
        do {
            frame = try self.reader.next()
        } catch let error as ProtocolError {
            return self.run(self.machine.decodingFailed(error))
        } catch {
            return self.run(self.machine.decodingFailed(.connection(.internalError, "\(error)")))
        }
        guard let frame else { return nil }
        self.lastFrameAt = now
        self.latestInputAt = max(self.latestInputAt, now)
        switch frame {
        case .ping, .pong: break
        default: self.lastActiveAt = now
        }
        self.frameStartedAt = nil
        return self.run(self.machine.receive(frame, now: now))
    }

    /// Reading paused (no whole frame left, or the connection is not writable): a frame left half-received starts the
    /// frame timeout, so a trickled frame does not keep a connection alive.
    package mutating func readingPaused(now: NIODeadline) -> [Action] {
        guard self.reader.hasPartialFrame else {
            self.frameStartedAt = nil
            return []
        }
        guard self.frameStartedAt == nil, !self.closed else { return [] }
        self.frameStartedAt = now
        return self.scheduleLiveness(now: now)
    }

    package mutating func timerFired(_ timer: Timer, now: NIODeadline) -> [Action] {
        self.latestInputAt = max(self.latestInputAt, now)
        switch timer {
        case .handshake:
            guard !self.machine.isReady, !self.closed else { return [] }
            return self.failConnection(.timeout, "no HELLO and authentication within \(self.limits.handshakeTimeout)")
        case .liveness:
            return self.checkLiveness(now: now)
        case .grace:
            return self.graceEnded()
        case .sync(let id):
            guard var pipeline = self.pipelines[id] else { return [] }
            let steps = pipeline.syncTimerFired()
            self.pipelines[id] = pipeline
            return self.run(steps, of: id)
        }
    }

    /// The accounts as the relay's last look at the catalog found them, by name: a connection whose principal is gone
    /// closes, rather than act on under a token no longer valid (SPEC §2.3). Gone means the account was deleted (a name
    /// given again is another account, with another token), disabled, or given a new token (`token rotate`).
    mutating func accountsLooked(_ accounts: [String: Account], now: NIODeadline) -> [Action] {
        self.latestInputAt = max(self.latestInputAt, now)
        guard !self.closed, let principal = self.account else { return [] }
        guard let current = accounts[principal.name] else {
            return self.failConnection(
                .unauthenticated, "account \"\(principal.name)\" was deleted (ask the relay operator for a new token)")
        }
        guard !current.revoked else {
            return self.failConnection(
                .unauthenticated, "the token of account \"\(principal.name)\" was revoked (ask the relay operator for a new one)")
        }
        guard current.tokenHash == principal.tokenHash else {
            return self.failConnection(
                .unauthenticated, "the token of account \"\(principal.name)\" was replaced (token rotate): connect with the new one")
        }
        return self.giveBackIdleShare(now: now)
    }

    /// Gives the connection's share of the memory budget back, once.
    mutating func leaveWindowShare() {
        if self.holdsWindowShare {
            self.resources.memory.leave(self.grantedWindow)
            self.holdsWindowShare = false
        }
        self.grantedWindow = 0
    }

    /// A connection that holds more of the memory budget than its fair share and has sent nothing but PINGs for
    /// ``RelaySessionSettings/idleShareTimeout``, while the budget cannot give every connection a whole window, is asked
    /// to go: GOAWAY, what arrived is made durable and acknowledged, then it closes, its share going to the connections
    /// that upload. The credit it holds cannot be taken back otherwise (SPEC §5.5); connections that only PING, or that
    /// open an upload and then send nothing, held the whole budget while another account's upload crawled at the floor.
    /// Its agent reconnects and goes on from the acknowledged bytes. Checked at each of the relay's looks at the
    /// accounts.
    ///
    /// Idle means the agent could send and does not: work of the relay's own (an OPEN looked up, a key waited for,
    /// chunks written or synced, a HASH verified) is activity, and so is holding no credit, which leaves the agent
    /// nothing it may send.
    mutating func giveBackIdleShare(now: NIODeadline) -> [Action] {
        let memory = self.resources.memory
        let relayWorks =
            !self.opening.isEmpty || !self.waitingForKey.isEmpty
            || self.pipelines.values.contains { !$0.isOpen || !$0.isQuiet || $0.isVerifying }
        if relayWorks || (self.machine.openStreamCount > 0 && self.machine.connectionWindowOutstanding == 0) {
            self.lastActiveAt = now
            return []
        }
        let fair = memory.total / max(1, memory.holders)
        guard case .none = self.drain, self.machine.isReady, self.holdsWindowShare, self.grantedWindow > self.windowFloor,
            self.grantedWindow > fair, now - self.lastActiveAt >= TimeAmount(self.resources.settings.idleShareTimeout),
            memory.free < self.preferredWindow, memory.holders * self.preferredWindow > memory.total,
            let goAway = self.machine.sendGoAway(.noError, "idle while uploads wait for the relay's memory; reconnect to send more")
        else { return [] }
        self.drain = .draining
        let metadata: Logger.Metadata = ["connection.window": "\(self.grantedWindow)", "memory.free": "\(memory.free)"]
        // The drain period is skipped: an idle agent has nothing in flight to finish. Its open uploads are made durable
        // and acknowledged, then the connection closes.
        let actions =
            [.log(.info, "asking an idle connection to go: its memory share goes to uploads", metadata)] + self.write(goAway)
            + self.graceEnded()
        // Closed, it holds no chunk, and after GOAWAY it can open no upload: its share goes back now, not when TLS has
        // finished closing (a peer that does not answer close_notify holds the socket for seconds).
        if self.closed { self.leaveWindowShare() }
        return actions
    }

    /// The relay's key locks across relays were lost (its connection to the shared catalog dropped): uploads stop, since
    /// another relay may take their keys now. The agent reconnects and goes on from the acknowledged bytes.
    mutating func keyLocksLost() -> [Action] {
        guard !self.closed, !self.pipelines.isEmpty || !self.opening.isEmpty else { return [] }
        return self.failConnection(
            .storageError, "the relay lost its connection to the shared catalog; reconnect: uploads go on from their acknowledged bytes"
        )
    }

    /// The catalog's answer to the agent's PLAN (SPEC §7.2): the ROOM, or the connection error that stands for it (the
    /// account was revoked, the catalog could not be read).
    package mutating func planAnswered(_ answer: Result<Frame.Room, UploadPolicy.Refusal>) -> [Action] {
        guard !self.closed else { return [] }
        switch answer {
        case .success(let room):
            return self.machine.sendRoom(room).map { self.write($0) } ?? []
        case .failure(let refusal):
            return self.failConnection(refusal.code, refusal.message)
        }
    }

    /// The channel is gone. Durable state stays in the catalog: the agent resumes on its next connection.
    package mutating func connectionClosed() -> [Action] {
        self.closed = true
        self.leaveWindowShare()
        var actions: [Action] = [.cancel(.handshake), .cancel(.liveness), .cancel(.grace)]
        for id in self.pipelines.keys.sorted() {
            actions += self.abortUpload(id, keepSession: true)
        }
        for id in self.opening.keys.sorted() {
            self.streamClosedWhileOpening(id, discard: false)
        }
        return actions
    }

    // MARK: Authentication

    /// The catalog's answer for the HELLO's credential.
    package mutating func authenticated(_ result: Result<Account?, any Error>) -> [Action] {
        guard !self.closed else { return [] }
        switch result {
        case .success(let account?) where !account.revoked:
            self.account = account
            // The connection window is this connection's share of the relay's memory budget.
            self.grantedWindow = self.resources.memory.join(preferred: self.preferredWindow, floor: self.windowFloor)
            self.holdsWindowShare = true
            var actions: [Action] = [.cancel(.handshake)]
            // With no quota every selection fits: a plan would only cost the agent a round trip (SPEC §7.2).
            let withheld: Frame.Features = account.quota == nil ? [.quotaPlan] : []
            if let welcome = self.machine.acceptHello(account: account.name, connectionWindow: self.grantedWindow, withholding: withheld) {
                actions += self.write(welcome)
            }
            return actions + [.log(.debug, "agent authenticated", [:])]
        case .success(let account?):
            return self.failConnection(
                .unauthenticated, "the token of account \"\(account.name)\" was revoked (ask the relay operator for a new one)")
        case .success(nil):
            return self.failConnection(.unauthenticated, "unknown token (check --token or UPLOAD_TOKEN)")
        case .failure(let error):
            // The database's words go to the log, not to a peer that may be anyone (SPEC §12.3).
            return [.log(.error, "catalog failed while checking a token", ["error": "\(error)"])]
                + self.failConnection(.internalError, "the relay could not check the token (its catalog failed); retry later")
        }
    }

    /// The connection window a connection gets while the memory budget has room (``ProtocolLimits/connectionWindow``).
    var preferredWindow: Int { self.resources.settings.limits.connectionWindow }

    /// The smallest connection window (never below SPEC §5.5's 64 KiB): the budget may pass its total by this much per
    /// connection.
    var windowFloor: Int {
        min(self.preferredWindow, max(self.resources.settings.minimumConnectionWindow, ProtocolLimits.smallestResizedWindow))
    }

    /// Moves the connection window toward this connection's fair share of the memory budget (SPEC §5.5), before
    /// storage's consumption returns credit: a share that shrank keeps credit back, one that grew takes what the budget
    /// has free. What the connection holds of the budget never drops below what the agent may still make it hold.
    mutating func shareWindow() {
        guard self.holdsWindowShare else { return }
        let (held, fair) = self.resources.memory.rebalance(
            holding: self.grantedWindow, outstanding: self.machine.connectionWindowOutstanding, preferred: self.preferredWindow,
            floor: self.windowFloor)
        self.grantedWindow = held
        self.machine.resizeConnectionWindow(to: min(fair, held))
    }

    // MARK: Liveness (SPEC §2.3)

    /// Arms the liveness check at the next deadline: the idle timeout since the last whole frame, or the frame timeout
    /// since the first byte of a frame still arriving. A timeout of zero is off.
    func scheduleLiveness(now: NIODeadline) -> [Action] {
        guard !self.closed else { return [] }
        var deadline: NIODeadline? = nil
        if self.limits.idleTimeout > .zero {
            deadline = self.lastFrameAt + TimeAmount(self.limits.idleTimeout)
        }
        if let started = self.frameStartedAt, self.limits.frameTimeout > .zero {
            let frameDeadline = started + TimeAmount(self.limits.frameTimeout)
            deadline = min(deadline ?? frameDeadline, frameDeadline)
        }
        guard let deadline else { return [] }
        return [.schedule(.liveness, in: max(.zero, deadline - now))]
    }

    mutating func checkLiveness(now: NIODeadline) -> [Action] {
        guard !self.closed else { return [] }
        if let started = self.frameStartedAt, self.limits.frameTimeout > .zero, now - started >= TimeAmount(self.limits.frameTimeout) {
            return self.failConnection(.timeout, "one frame took longer than \(self.limits.frameTimeout) to arrive")
        }
        let idle = TimeAmount(self.limits.idleTimeout)
        if self.limits.idleTimeout > .zero && now - self.lastFrameAt >= idle {
            guard !self.machine.isReady else {
                return self.failConnection(.timeout, "no frame for \(self.limits.idleTimeout)")
            }
            // Before WELCOME the handshake timeout governs.
            self.lastFrameAt = now
        }
        return self.scheduleLiveness(now: now)
    }
}
