import Logging
import NIOCore
import NIOTLS
import UploadProtocol
import CoreMetrics
import NIOConcurrencyHelpers

/// What every connection of one relay is given (``Relay/connectionDependencies``).
package struct RelayConnectionDependencies: Sendable {
    package var resources: RelaySessionResources
    package var policy: UploadPolicy
    package var storage: UploadStorage.Context
    var executor: RelayExecutor
    var metrics: RelayMetrics
    /// Counts the live handlers (``RelayHealth/liveHandlers``).
    var health: RelayHealth
}

/// One agent connection on the relay: turns channel events into ``RelaySession`` inputs and runs the actions the
/// session returns (write, close, timers, catalog and storage work). It decides nothing itself.
final class RelayConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var session: RelaySession
    private let dependencies: RelayConnectionDependencies
    private let work: RelayWork
    private var logger: Logger
    private var context: ChannelHandlerContext? = nil
    private var timers = HandlerTimers<RelaySession.Timer>()
    /// The storage work of each upload, from its lookup until it lets go.
    private var executors: [StreamID: UploadExecutor] = [:]
    private var needsFlush = false
    /// Asks the listener for an authenticated connection's place, once the token is accepted; false: none is free.
    private let takePlace: (any Channel) -> Bool

    init(
        dependencies: RelayConnectionDependencies, logger: Logger, eventLoop: any EventLoop,
        takePlace: @escaping (any Channel) -> Bool = { _ in true }
    ) {
        self.dependencies = dependencies
        self.takePlace = takePlace
        self.work = RelayWork(dependencies: dependencies, eventLoop: eventLoop)
        self.logger = logger
        // An OPEN that waited for its key runs again on this connection's loop once the key is free. The session holds
        // the handler weakly: the handler owns the session.
        let handler = NIOLoopBound(WeakBox<RelayConnectionHandler>(), eventLoop: eventLoop)
        self.session = RelaySession(resources: dependencies.resources, now: .now()) { open, key in
            eventLoop.execute { handler.value.value?.act(on: { $0.openUpload(open, key) }) }
        }
        handler.value.value = self
        dependencies.health.liveHandlers.withLockedValue { $0 += 1 }
    }

    deinit {
        self.dependencies.health.liveHandlers.withLockedValue { $0 -= 1 }
    }

    /// Feeds one input to the session and runs what it decides.
    private func act(on input: (inout RelaySession) -> [RelaySession.Action]) {
        self.run(input(&self.session))
        self.flushIfNeeded()
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if let remote = context.channel.remoteAddress { self.logger[metadataKey: "peer"] = "\(remote)" }
        self.act { $0.started(now: .now()) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.act { $0.connectionClosed() }
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = self.unwrapInboundIn(data)
        self.dependencies.metrics.receivedBytes.increment(by: Int64(bytes.readableBytes))
        self.session.received(bytes)
        self.processFrames()
    }

    /// Runs the frames held while the connection can take their answers: a peer that never reads cannot make the relay
    /// buffer answers without bound.
    private func processFrames() {
        guard let context = self.context else { return }
        while context.channel.isWritable, let actions = self.session.nextFrame(now: .now()) {
            self.run(actions)
        }
        // Answers are flushed once per read cycle, at channelReadComplete.
        self.run(self.session.readingPaused(now: .now()))
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

    func channelReadComplete(context: ChannelHandlerContext) {
        self.flushIfNeeded()
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case is RelayShutdownEvent:
            self.act { $0.shutdown() }
        case let looked as RelayAccountsEvent:
            self.act { $0.accountsLooked(looked.accounts, now: .now()) }
        case is RelayKeyLocksLostEvent:
            self.act { $0.keyLocksLost() }
        case TLSUserEvent.handshakeCompleted(let negotiated):
            self.act { $0.tlsHandshakeCompleted(alpn: negotiated, now: .now()) }
            if self.session.alpnAccepted { context.fireUserInboundEventTriggered(event) }
        default:
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !self.session.closed { self.logger.info("connection error", metadata: ["error": "\(error)"]) }
        self.act { $0.close() }
        context.close(promise: nil)
    }

    // MARK: Running actions

    private func run(_ actions: [RelaySession.Action]) {
        for action in actions {
            switch action {
            case .write(let frame):
                guard let context = self.context else { continue }
                var buffer = context.channel.allocator.buffer(capacity: 64)
                FrameEncoder.encode(frame, into: &buffer)
                self.dependencies.metrics.wrote(frame, account: self.session.account?.name)
                context.write(self.wrapOutboundOut(buffer), promise: nil)
                self.needsFlush = true
            case .close:
                self.flushIfNeeded()
                self.context?.close(promise: nil)
            case .schedule(let timer, let delay):
                self.timers.schedule(timer, in: delay, on: self.context?.eventLoop) { [weak self] in self?.act { $0.timerFired(timer, now: .now()) } }
            case .cancel(let timer):
                self.timers.cancel(timer)
            case .authenticate(let hello):
                self.logger[metadataKey: "agent"] = "\(hello.agentName)"
                self.work.authenticate(hello) { result in
                    if case .success(let account?) = result, !account.revoked {
                        self.logger[metadataKey: "account"] = "\(account.name)"
                        if let channel = self.context?.channel, !self.takePlace(channel) {
                            self.act {
                                $0.failConnection(.refusedStream, "the relay holds its most connections; retry later")
                            }
                            return
                        }
                    }
                    self.act { $0.authenticated(result) }
                }
            case .lookUp(let open, let key, let account):
                self.work.lookUp(open, key, account, logger: self.logger) { decision, executor in
                    // Held until its release step: storage finishes even after the connection has gone.
                    executor?.onCompletion = { completion in self.act { $0.storageFinished(open.streamID, completion) } }
                    self.executors[open.streamID] = executor
                    self.act { $0.uploadLookedUp(open.streamID, decision, key: key) }
                }
            case .plan(let plan, let account):
                self.work.plan(plan, account) { answer in self.act { $0.planAnswered(answer) } }
            case .storage(let id, let step):
                self.executors[id]?.run(step)
                // The last step: the pool holds the executor (and this handler) until it reported.
                if case .release = step { self.executors[id] = nil }
            case .dropStorage(let id):
                self.executors[id] = nil
            case .discardSession(let open, let key, let account):
                self.dependencies.policy.discardSession(named: open, key: key, account: account.name)
            case .log(let level, let message, let metadata):
                self.logger.log(level: level, "\(message)", metadata: metadata)
            }
        }
    }

    private func flushIfNeeded() {
        if self.needsFlush, let context = self.context {
            self.needsFlush = false
            context.flush()
        }
    }
}

// Held by its channel and used on its event loop only (NIO handlers are not Sendable).
@available(*, unavailable)
extension RelayConnectionHandler: Sendable {}
