import Logging
import NIOCore
import NIOSSL
import NIOTLS
import UploadProtocol

/// Asks a connection to shut down gracefully: GOAWAY, let uploads reach a durable point, close.
public struct RelayShutdownEvent: Sendable {
    public init() {}
}

/// The token of `account` was revoked: its connections close (issue 6 finding 6).
struct RelayAccountRevokedEvent: Sendable {
    var account: String
}

/// One agent connection on the relay: decodes frames, feeds the ``RelayConnectionStateMachine``,
/// and executes its actions. It does no protocol reasoning of its own.
final class RelayConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var machine: RelayConnectionStateMachine
    private var reader = FrameReader()
    private let services: RelayServices
    private var logger: Logger
    private var account: Account? = nil
    private var uploads: [StreamID: StreamUpload] = [:]
    /// This connection's window, taken from the relay's memory budget at WELCOME and given back at close.
    private var grantedWindow = 0
    /// Keys claimed by streams whose upload the relay is still looking up (the opener runs on the thread pool).
    private var openingClaims: [StreamID: String] = [:]
    /// Of those, streams that closed meanwhile: whether to drop the session when the lookup returns.
    private var closedWhileOpening: [StreamID: Bool] = [:]
    /// Streams whose OPEN waits for its key (the key's last upload is closing), and whether CANCEL came meanwhile.
    private var waitingForKey: [StreamID: Bool] = [:]
    private var context: ChannelHandlerContext? = nil
    private var handshakeTimer: Scheduled<Void>? = nil
    /// Checks the idle and frame timeouts (SPEC §2.3) at the next deadline.
    private var livenessTimer: Scheduled<Void>? = nil
    /// When the last whole frame arrived (or the connection was accepted).
    private var lastFrameAt = NIODeadline.now()
    /// When the first byte of the frame now arriving came; nil between frames.
    private var frameStartedAt: NIODeadline? = nil
    /// Whether TLS selected the protocol's ALPN id (SPEC §2.1); nothing is read before.
    private var alpnAccepted = false
    private var graceTimer: Scheduled<Void>? = nil
    private var closed = false
    private var needsFlush = false

    init(services: RelayServices, logger: Logger) {
        self.services = services
        self.logger = logger
        self.machine = RelayConnectionStateMachine(
            limits: services.configuration.limits, supportedFeatures: services.configuration.allowDeflate ? .known : []
        )
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if self.services.configuration.limits.idleTimeout > .zero {
            self.scheduleLivenessCheck()
        }
        if let remote = context.channel.remoteAddress {
            self.logger[metadataKey: "peer"] = "\(remote)"
        }
        let timeout = self.services.configuration.limits.handshakeTimeout
        self.handshakeTimer = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(timeout)) { [weak self] in
            guard let self, !self.machine.isReady, !self.closed else { return }
            self.failConnection(.timeout, "no HELLO and authentication within \(timeout)")
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.closed = true
        self.services.memory.give(self.grantedWindow)
        self.grantedWindow = 0
        self.handshakeTimer?.cancel()
        self.livenessTimer?.cancel()
        self.graceTimer?.cancel()
        // Durable state stays in the catalog: the agent resumes on its next connection.
        for upload in self.uploads.values {
            upload.abort(keepSession: true)
        }
        for id in self.openingClaims.keys {
            self.streamClosedWhileOpening(id, discard: false)
        }
        self.uploads.removeAll()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard self.alpnAccepted, !self.closed else { return }
        self.reader.append(self.unwrapInboundIn(data))
        self.processFrames()
    }

    /// Decodes and runs the frames held, while the connection can take their answers: a peer that does not read what
    /// the relay writes is not read either (issue 6 finding 7), so its answers cannot pile up in memory.
    private func processFrames() {
        guard let context = self.context else { return }
        while !self.closed && context.channel.isWritable {
            let frame: Frame?
            do {
                frame = try self.reader.next()
            } catch let error as ProtocolError {
                self.run(self.machine.decodingFailed(error))
                return
            } catch {
                self.run(self.machine.decodingFailed(.connection(.internalError, "\(error)")))
                return
            }
            guard let frame else { break }
            self.lastFrameAt = .now()
            self.frameStartedAt = nil
            self.run(self.machine.receive(frame))
        }
        if self.reader.hasPartialFrame {
            if self.frameStartedAt == nil {
                self.frameStartedAt = .now()
                self.livenessTimer?.cancel()
                self.scheduleLivenessCheck()
            }
        } else {
            self.frameStartedAt = nil
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        let writable = context.channel.isWritable
        context.channel.setOption(.autoRead, value: writable).whenFailure { _ in }
        if writable {
            self.processFrames()
            self.flushIfNeeded()
            context.read()
        }
        context.fireChannelWritabilityChanged()
    }

    /// Closes the connection when no whole frame came for the idle timeout, or one frame has taken longer than the
    /// frame timeout (SPEC §2.3): a trickled frame does not keep a connection alive (issue 6 finding 15).
    private func scheduleLivenessCheck() {
        guard let context = self.context, !self.closed else { return }
        let limits = self.services.configuration.limits
        let idle = TimeAmount(limits.idleTimeout)
        let frame = TimeAmount(limits.frameTimeout)
        var deadline = self.lastFrameAt + idle
        if let started = self.frameStartedAt { deadline = min(deadline, started + frame) }
        self.livenessTimer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [weak self] in
            guard let self, !self.closed else { return }
            let now = NIODeadline.now()
            if let started = self.frameStartedAt, now - started >= frame {
                self.failConnection(.timeout, "one frame took longer than \(limits.frameTimeout) to arrive")
            } else if now - self.lastFrameAt >= idle && self.machine.isReady {
                self.failConnection(.timeout, "no frame for \(limits.idleTimeout)")
            } else {
                // Before WELCOME the handshake timeout governs.
                if now - self.lastFrameAt >= idle { self.lastFrameAt = now }
                self.scheduleLivenessCheck()
            }
            self.flushIfNeeded()
        }
    }
    func channelReadComplete(context: ChannelHandlerContext) {
        self.flushIfNeeded()
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case is RelayShutdownEvent:
            self.beginShutdown()
        case let revoked as RelayAccountRevokedEvent where revoked.account == self.account?.name:
            self.failConnection(.unauthenticated, "the token of account \"\(revoked.account)\" was revoked (ask the relay operator for a new one)")
        case TLSUserEvent.handshakeCompleted(let negotiated):
            guard negotiated == RelayServer.alpn else {
                // SPEC §2.1: only agents that asked for this protocol are served; no frame is read or written.
                self.logger.info("closing connection: TLS did not select ALPN \(RelayServer.alpn)", metadata: ["alpn": "\(negotiated ?? "none")"])
                self.closed = true
                context.close(promise: nil)
                return
            }
            self.alpnAccepted = true
            self.lastFrameAt = .now()
            context.fireUserInboundEventTriggered(event)
        default:
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !self.closed {
            self.logger.info("connection error", metadata: ["error": "\(error)"])
        }
        self.closed = true
        context.close(promise: nil)
    }

    // MARK: Executing actions

    private func run(_ action: RelayAction) {
        switch action {
        case .none:
            break
        case .authenticate(let hello):
            self.authenticate(hello)
        case .openUpload(let open, let key):
            self.openUpload(open, key)
        case .write(let chunk):
            self.uploads[chunk.streamID]?.enqueue(chunk)
        case .finish(let hash):
            self.uploads[hash.streamID]?.finish(hash)
        case .abortUpload(let id, let code, let message, let discard, let credit):
            self.logger.debug("agent closed stream", metadata: ["stream.id": "\(id)", "error.code": "\(code.name)", "error.message": "\(message)"])
            if let credit { self.write(.credit(credit)) }
            if let upload = self.uploads.removeValue(forKey: id) {
                upload.abort(keepSession: !discard)
            } else {
                self.streamClosedWhileOpening(id, discard: discard)
            }
            self.closeIfDrained()
        case .send(let frame):
            self.write(frame)
        case .resetStream(let error, let credit):
            self.write(.error(error))
            if let credit { self.write(.credit(credit)) }
            // SPEC §8.2: a size that does not add up makes the staged bytes worthless; other resets keep them.
            let keep = error.code != .sizeMismatch && error.code != .hashMismatch
            if let upload = self.uploads.removeValue(forKey: error.streamID) {
                upload.abort(keepSession: keep)
            } else {
                self.streamClosedWhileOpening(error.streamID, discard: !keep)
            }
        case .closeConnection(let error):
            self.logger.info("closing connection", metadata: ["error.code": "\(error.code.name)", "error.message": "\(error.message)"])
            self.write(.error(error))
            self.close()
        case .peerClosed(let code, let message):
            self.logger.info("agent closed the connection", metadata: ["error.code": "\(code.name)", "error.message": "\(message)"])
            self.close()
        case .peerGoingAway:
            break
        }
        self.closeIfDrained()
    }

    private func write(_ frame: Frame) {
        guard let context = self.context, !self.closed || frame.type == .error else { return }
        var buffer = context.channel.allocator.buffer(capacity: 64)
        FrameEncoder.encode(frame, into: &buffer)
        context.write(self.wrapOutboundOut(buffer), promise: nil)
        self.needsFlush = true
    }

    /// Writes frames the state machine produced; an ERROR on stream 0 among them closes the connection.
    private func write(_ frames: [Frame]) {
        for frame in frames {
            self.write(frame)
            if case .error(let error) = frame, error.streamID.isConnection {
                self.logger.info("closing connection", metadata: ["error.code": "\(error.code.name)", "error.message": "\(error.message)"])
                self.close()
                return
            }
        }
    }

    private func flushIfNeeded() {
        if self.needsFlush, let context = self.context {
            self.needsFlush = false
            context.flush()
        }
    }

    private func close() {
        guard !self.closed, let context = self.context else { return }
        self.closed = true
        self.flushIfNeeded()
        context.close(promise: nil)
    }

    private func failConnection(_ code: WireErrorCode, _ message: String) {
        guard !self.closed else { return }
        self.logger.info("closing connection", metadata: ["error.code": "\(code.name)", "error.message": "\(message)"])
        self.write(self.machine.failConnection(code, message))
        self.close()
    }

    // MARK: Authentication and opening

    private func authenticate(_ hello: Frame.Hello) {
        let catalog = self.services.catalog
        let hash = Tokens.hash(hello.credential)
        self.logger[metadataKey: "agent"] = "\(hello.agentName)"
        guard let context = self.context else { return }
        self.services.threadPool.runIfActive(eventLoop: context.eventLoop) {
            try catalog.account(tokenHash: hash)
        }.assumeIsolated().whenComplete { result in
            guard !self.closed else { return }
            switch result {
            case .success(let account?) where !account.revoked:
                self.account = account
                self.logger[metadataKey: "account"] = "\(account.name)"
                self.handshakeTimer?.cancel()
                // The connection window is this connection's share of the relay's memory budget (finding 24).
                let configuration = self.services.configuration
                self.grantedWindow = self.services.memory.share(
                    preferred: configuration.limits.connectionWindow,
                    floor: min(configuration.limits.connectionWindow, configuration.minimumConnectionWindow)
                )
                if let welcome = self.machine.acceptHello(account: account.name, connectionWindow: self.grantedWindow) {
                    self.write(welcome)
                }
                self.reader.maxFrameSize = self.services.configuration.limits.maxFrameSize
                self.logger.debug("agent authenticated")
            case .success(let account?):
                self.failConnection(.unauthenticated, "the token of account \"\(account.name)\" was revoked (ask the relay operator for a new one)")
            case .success(nil):
                self.failConnection(.unauthenticated, "unknown token (check --token or UPLOAD_TOKEN)")
            case .failure(let error):
                self.failConnection(.internalError, "relay catalog failed: \(error)")
            }
            self.flushIfNeeded()
        }
    }

    private func openUpload(_ open: Frame.Open, _ key: ObjectKey) {
        guard let account = self.account, let context = self.context, !self.closed else { return }
        let id = open.streamID
        let cancelledWhileWaiting = self.waitingForKey.removeValue(forKey: id) ?? false
        guard self.machine.isOpening(id) else {
            // Closed while it waited for its key: nothing was claimed for it, but a CANCEL still abandons the session
            // the OPEN named (SPEC §3.11).
            if cancelledWhileWaiting { self.discardSession(named: open, key: key, account: account) }
            return
        }
        let claim = KeyClaims.name(account: account.name, key: key.value)
        let retry = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loop = context.eventLoop
        switch self.services.claims.claim(claim, whenFree: { loop.execute { retry.value.openUpload(open, key) } }) {
        case .busy:
            self.write(self.machine.resetStream(id, .keyBusy, "another upload of \"\(key)\" is in progress; retry when it ends"))
            return
        case .queued:
            // The key's last upload is closing: this OPEN goes on once it is released.
            self.waitingForKey[id] = false
            return
        case .claimed:
            break
        }
        // Each open upload holds a descriptor for its staging file: past the budget, refuse before opening one (finding 19).
        guard self.services.uploadSlots.take(1) else {
            self.services.claims.release(claim)
            self.write(
                self.machine.resetStream(
                    id, .refusedStream,
                    "the relay has \(self.services.uploadSlots.total) uploads open, its limit (file descriptors); retry shortly"
                )
            )
            return
        }
        self.openingClaims[id] = claim
        let opener = UploadOpener(services: self.services)
        let services = self.services
        services.threadPool.runIfActive(eventLoop: context.eventLoop) { () -> UploadOpener.Decision in
            // Quota, revocation and dedup decisions read the account as it is now, not as it was at HELLO.
            guard let current = try services.catalog.account(named: account.name), !current.revoked else {
                return .refuse(.unauthenticated, "the token of account \"\(account.name)\" was revoked")
            }
            return opener.decide(account: current, open: open, key: key)
        }.assumeIsolated().whenComplete { result in
            self.openingClaims[id] = nil
            let closedMeanwhile = self.closedWhileOpening.removeValue(forKey: id)
            defer {
                self.closeIfDrained()
                self.flushIfNeeded()
            }
            let decision: UploadOpener.Decision
            switch result {
            case .success(let d):
                decision = d
            case .failure(let error):
                decision = .refuse(.internalError, "relay failed to open the upload: \(error)")
            }
            switch decision {
            case .stored(let size):
                services.uploadSlots.give(1)
                services.claims.release(claim)
                if let frame = self.machine.sendOffset(Frame.Offset(streamID: id, disposition: .stored, offset: size)) {
                    self.write(frame)
                    if let credit = self.machine.flushConnectionCredit() { self.write(credit) }
                }
            case .refuse(let code, let message):
                services.uploadSlots.give(1)
                services.claims.release(claim)
                self.write(self.machine.resetStream(id, code, message))
            case .upload(let session, let staging, let sha1, let resumed, let byteLimit):
                let offset = Frame.Offset(
                    streamID: id, disposition: resumed ? .resume : .start, offset: UInt64(session.durableOffset),
                    resumeToken: session.resumeToken
                )
                let upload = StreamUpload(
                    id: id, key: key, account: account, open: open, session: session, staging: staging, sha1: sha1,
                    byteLimit: byteLimit, services: services, eventLoop: context.eventLoop, logger: self.logger
                ) { [weak self] event in
                    self?.uploadEvent(id, event)
                }
                guard !self.closed, let frame = self.machine.sendOffset(offset) else {
                    // The agent cancelled, or the connection went, while we looked the upload up.
                    upload.abort(keepSession: !(closedMeanwhile ?? false))
                    return
                }
                self.uploads[id] = upload
                self.write(frame)
                self.logger.debug(
                    "upload open",
                    metadata: ["stream.id": "\(id)", "upload.key": "\(key)", "upload.offset": "\(session.durableOffset)"]
                )
            }
        }
    }

    /// A stream closed while its upload is looked up: its key is closing now (an OPEN of it waits, not KEY_BUSY), and the
    /// lookup's result is dropped when it returns.
    private func streamClosedWhileOpening(_ id: StreamID, discard: Bool) {
        if self.waitingForKey[id] != nil {
            self.waitingForKey[id] = discard
            return
        }
        guard let claim = self.openingClaims[id] else { return }
        self.services.claims.markClosing(claim)
        self.closedWhileOpening[id] = discard
    }

    /// Drops the session `open` would have resumed (same resume token or fingerprint), under the key's claim.
    private func discardSession(named open: Frame.Open, key: ObjectKey, account: Account) {
        let claim = KeyClaims.name(account: account.name, key: key.value)
        let services = self.services
        guard services.claims.tryClaim(claim) else { return }
        // Closing from the start: an OPEN of the key meanwhile waits for the discard, never KEY_BUSY.
        services.claims.markClosing(claim)
        services.threadPool.submit { state in
            defer { services.claims.release(claim) }
            guard state == .active, let session = try? services.catalog.session(account: account.name, key: key.value) else { return }
            let byToken = !open.resumeToken.isEmpty && open.resumeToken == session.resumeToken
            let byFingerprint = !open.fingerprint.isEmpty && open.fingerprint == session.fingerprint
            guard byToken || byFingerprint else { return }
            try? services.store.removeStaging(session.stagingName)
            try? services.catalog.deleteSession(id: session.id)
        }
    }

    private func uploadEvent(_ id: StreamID, _ event: StreamUpload.Event) {
        guard !self.closed else { return }
        switch event {
        case .consumed(let bytes):
            self.write(self.machine.storageConsumed(id, bytes: bytes))
        case .durable(let offset):
            if let ack = self.machine.sendAck(id, offset: offset) {
                self.write(ack)
            }
            self.closeIfDrained()
        case .committed(let result):
            self.uploads.removeValue(forKey: id)
            if let frame = self.machine.sendResult(result) {
                self.write(frame)
                if let credit = self.machine.flushConnectionCredit() { self.write(credit) }
            }
            self.logger.info(
                "upload committed",
                metadata: ["upload.key": "\(result.key)", "upload.size": "\(result.size)", "upload.sha1": "\(result.sha1)"]
            )
            self.closeIfDrained()
        case .failed(let code, let message):
            self.uploads.removeValue(forKey: id)
            self.write(self.machine.resetStream(id, code, message))
            self.closeIfDrained()
        }
        self.flushIfNeeded()
    }

    // MARK: Graceful shutdown (SPEC §6.5)

    /// Where a connection is in its graceful shutdown.
    private enum Drain {
        /// Not shutting down.
        case none
        /// GOAWAY sent: open streams go on (CHUNK, HASH, RESULT) for the drain period; the connection closes as soon as
        /// none is left open.
        case draining
        /// The drain period is over: what was received is made durable and acknowledged, verifying streams get their
        /// RESULT, then the connection closes.
        case finishing
    }

    private var drain = Drain.none

    private func beginShutdown() {
        guard !self.closed, case .none = self.drain else { return }
        guard self.machine.isReady, let goAway = self.machine.sendGoAway(.noError, "relay shutting down; resume on a new connection") else {
            self.close()
            return
        }
        self.drain = .draining
        self.write(goAway)
        self.flushIfNeeded()
        // The grace period is this connection's own timer, on its own event loop: nothing crosses loops during shutdown.
        let grace = self.services.configuration.shutdownGrace
        self.graceTimer = self.context?.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(grace)) { [weak self] in
            self?.finishDrain(after: grace)
        }
        self.closeIfDrained()
    }

    /// The drain period ended: make every upload durable, then close once each is quiet (a hard stop follows).
    private func finishDrain(after grace: Duration) {
        guard !self.closed, case .draining = self.drain else { return }
        self.drain = .finishing
        self.logger.info("drain period over: acknowledging what arrived, then closing", metadata: ["grace": "\(grace)"])
        for upload in self.uploads.values {
            upload.requestSync()
        }
        self.graceTimer = self.context?.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(grace)) { [weak self] in
            guard let self, !self.closed else { return }
            self.logger.warning("closing connection: uploads not durable within the shutdown grace period", metadata: ["grace": "\(grace)"])
            self.close()
        }
        self.closeIfDrained()
    }

    /// Closes when the connection has nothing left to do: during the drain, once no stream is open; after it, once every
    /// upload is durable and acknowledged and none is verifying.
    private func closeIfDrained() {
        guard !self.closed else { return }
        switch self.drain {
        case .none:
            // After the agent's GOAWAY the agent closes when it is done (SPEC §4.1); the idle timeout covers one that never does.
            break
        case .draining:
            if self.machine.openStreamCount == 0 { self.close() }
        case .finishing:
            if self.machine.openStreamCount == 0 || self.uploads.values.allSatisfy({ $0.isQuiet && !$0.isVerifying }) {
                self.close()
            }
        }
    }
}
