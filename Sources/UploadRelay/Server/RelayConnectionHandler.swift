import Logging
import NIOCore
import NIOSSL
import UploadProtocol

/// Asks a connection to shut down gracefully: GOAWAY, let uploads reach a durable point, close.
public struct RelayShutdownEvent: Sendable {
    public init() {}
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
    private var context: ChannelHandlerContext? = nil
    private var handshakeTimer: Scheduled<Void>? = nil
    private var graceTimer: Scheduled<Void>? = nil
    private var shuttingDown = false
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
        self.handshakeTimer?.cancel()
        self.graceTimer?.cancel()
        // Durable state stays in the catalog: the agent resumes on its next connection.
        for upload in self.uploads.values {
            upload.abort(discardSession: false)
        }
        self.uploads.removeAll()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.reader.append(self.unwrapInboundIn(data))
        while !self.closed {
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
            self.run(self.machine.receive(frame))
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
        case let idle as IdleStateHandler.IdleStateEvent where idle == .read:
            self.failConnection(.timeout, "no frame for \(self.services.configuration.limits.idleTimeout)")
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
        case .abortUpload(let id, let code, let message, let discard):
            self.logger.debug("agent closed stream", metadata: ["stream.id": "\(id)", "error.code": "\(code.name)", "error.message": "\(message)"])
            self.uploads.removeValue(forKey: id)?.abort(discardSession: discard)
            self.closeIfDrained()
        case .send(let frame):
            self.write(frame)
        case .resetStream(let error, let credit):
            self.write(.error(error))
            if let credit { self.write(.credit(credit)) }
            self.uploads.removeValue(forKey: error.streamID)?.abort(discardSession: false)
        case .closeConnection(let error):
            self.logger.info("closing connection", metadata: ["error.code": "\(error.code.name)", "error.message": "\(error.message)"])
            self.write(.error(error))
            self.close()
        case .peerClosed(let code, let message):
            self.logger.info("agent closed the connection", metadata: ["error.code": "\(code.name)", "error.message": "\(message)"])
            self.close()
        case .peerGoingAway:
            self.closeIfDrained()
        }
    }

    private func write(_ frame: Frame) {
        guard let context = self.context, !self.closed || frame.type == .error else { return }
        var buffer = context.channel.allocator.buffer(capacity: 64)
        FrameEncoder.encode(frame, into: &buffer)
        context.write(self.wrapOutboundOut(buffer), promise: nil)
        self.needsFlush = true
    }

    private func write(_ frames: [Frame]) {
        for frame in frames { self.write(frame) }
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
        self.services.threadPool.runIfActive(eventLoop: self.context!.eventLoop) {
            try catalog.account(tokenHash: hash)
        }.assumeIsolated().whenComplete { result in
            guard !self.closed else { return }
            switch result {
            case .success(let account?) where !account.revoked:
                self.account = account
                self.logger[metadataKey: "account"] = "\(account.name)"
                self.handshakeTimer?.cancel()
                self.write(self.machine.acceptHello(account: account.name))
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
        guard let account = self.account, let context = self.context else { return }
        let id = open.streamID
        guard self.services.claim(account: account.name, key: key.value) else {
            self.write(self.machine.resetStream(id, .keyBusy, "another upload of \"\(key)\" is in progress; retry when it ends"))
            return
        }
        let opener = UploadOpener(services: self.services)
        let services = self.services
        services.threadPool.runIfActive(eventLoop: context.eventLoop) {
            // Quota and dedup decisions read the account as it is now, not as it was at HELLO.
            let current = (try? services.catalog.account(named: account.name)) ?? account
            return (opener.decide(account: current, open: open, key: key), current)
        }.assumeIsolated().whenComplete { result in
            defer { self.flushIfNeeded() }
            let decision: UploadOpener.Decision
            let current: Account
            switch result {
            case .success(let (d, a)):
                decision = d
                current = a
            case .failure(let error):
                decision = .refuse(.internalError, "relay failed to open the upload: \(error)")
                current = account
            }
            switch decision {
            case .stored(let size):
                services.release(account: account.name, key: key.value)
                if let frame = self.machine.sendOffset(Frame.Offset(streamID: id, disposition: .stored, offset: size)) {
                    self.write(frame)
                }
            case .refuse(let code, let message):
                services.release(account: account.name, key: key.value)
                self.write(self.machine.resetStream(id, code, message))
            case .upload(let session, let staging, let sha1, let resumed):
                let offset = Frame.Offset(
                    streamID: id, disposition: resumed ? .resume : .start, offset: UInt64(session.durableOffset),
                    resumeToken: session.resumeToken
                )
                let upload = StreamUpload(
                    id: id, key: key, account: current, open: open, session: session, staging: staging, sha1: sha1,
                    services: services, eventLoop: context.eventLoop, logger: self.logger
                ) { [weak self] event in
                    self?.uploadEvent(id, event)
                }
                guard let frame = self.machine.sendOffset(offset), !self.closed else {
                    // The agent cancelled, or the connection went, while we looked the upload up.
                    upload.abort(discardSession: false)
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
            }
            self.logger.info(
                "upload committed",
                metadata: ["upload.key": "\(result.key)", "upload.size": "\(result.size)", "upload.sha1": "\(result.sha1)"]
            )
            self.closeIfDrained()
        case .failed(let code, let message, let discard):
            self.uploads.removeValue(forKey: id)?.abort(discardSession: discard)
            self.write(self.machine.resetStream(id, code, message))
            self.closeIfDrained()
        }
        self.flushIfNeeded()
    }

    // MARK: Graceful shutdown (SPEC §6.5)

    private func beginShutdown() {
        guard !self.closed, !self.shuttingDown else { return }
        self.shuttingDown = true
        // The grace period is this connection's own timer, on its own event loop: nothing crosses loops during shutdown.
        let grace = self.services.configuration.shutdownGrace
        self.graceTimer = self.context?.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(grace)) { [weak self] in
            guard let self, !self.closed else { return }
            self.logger.warning("closing connection: uploads not drained within the shutdown grace period", metadata: ["grace": "\(grace)"])
            self.close()
        }
        guard self.machine.isReady, let goAway = self.machine.sendGoAway(.noError, "relay shutting down; resume on a new connection") else {
            self.close()
            return
        }
        self.write(goAway)
        for upload in self.uploads.values {
            upload.requestSync()
        }
        self.flushIfNeeded()
        self.closeIfDrained()
    }

    /// During shutdown: once every upload is durable and acknowledged, close.
    private func closeIfDrained() {
        guard self.shuttingDown, !self.closed else { return }
        if self.uploads.values.allSatisfy(\.isQuiet) {
            self.close()
        }
    }
}
