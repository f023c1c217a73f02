import Logging
import NIOCore
import NIOPosix
import UploadChecksums
import UploadProtocol

/// One connection to the relay: turns channel events into ``AgentSession`` inputs and runs the actions the session
/// returns (write, close, source work on the thread pool, backoff timers, events). It decides nothing itself.
final class AgentConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var session: AgentSession
    private var pool: NIOThreadPool
    /// `--bwlimit`, shared by every connection of the run; reads wait for it on the pool.
    private var bandwidth: BandwidthLimit?
    private var onEvent: @Sendable (UploadEvent) -> Void
    /// An adaptive run's measure of its link, told the round trip when the connection comes up.
    private var meter: LinkMeter?
    /// Told the outcome once: the connection's end, or its quota plan's answer when it stays up after it (until a run
    /// takes it, with a promise of its own: ``adopt(queue:pool:bandwidth:meter:done:onEvent:)``).
    private var done: EventLoopPromise<ConnectionOutcome>?
    private let logger: Logger
    private var context: ChannelHandlerContext? = nil
    private var needsFlush = false
    /// Payload bytes written since the last flush.
    private var unflushed = 0
    /// A flush once this much payload is written: TLS encrypts what one flush carries into a buffer of its size, freed
    /// once the socket took it, so a big chunk goes on its own; small ones (a small file's one CHUNK with its OPEN and
    /// HASH, and others of the same turn) share a flush, one write to the socket, not one each.
    static let flushBytes = 128 << 10

    init(
        configuration: AgentConfiguration, queue: JobQueue, pool: NIOThreadPool, bandwidth: BandwidthLimit?, logger: Logger,
        done: EventLoopPromise<ConnectionOutcome>, plan: QuotaPlan.Request? = nil, keepAfterPlan: Bool = false, meter: LinkMeter? = nil,
        onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) {
        self.meter = meter
        self.session = AgentSession(configuration: configuration, queue: queue, plan: plan, keepAfterPlan: keepAfterPlan)
        self.pool = pool
        self.bandwidth = bandwidth
        self.logger = logger
        self.done = done
        self.onEvent = onEvent
    }

    /// Feeds one input to the session and runs what it decides.
    private func act(on input: (inout AgentSession) -> [AgentSession.Action]) {
        self.run(input(&self.session))
        self.session.noteOwed(now: .now)
        self.flush()
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func channelActive(context: ChannelHandlerContext) {
        self.listen(context: context)
        let roundTrip = self.measureRoundTrip(context: context)
        self.act { $0.connected(roundTrip: roundTrip, now: .now) }
        context.fireChannelActive()
    }

    /// Jobs that come back to the queue from elsewhere (a late preparation of an earlier connection) wake this one,
    /// always through the event loop, never from inside an action.
    private func listen(context: ChannelHandlerContext) {
        let handler = NIOLoopBound(WeakHandler(self), eventLoop: context.eventLoop)
        let loop = context.eventLoop
        self.session.queue.setListener(ObjectIdentifier(self)) { loop.execute { handler.value.handler?.act { $0.jobsChanged() } } }
    }

    /// The run's round trip (its first connection's), which every connection of an adaptive run decides on. A relay
    /// on this host is no long link whatever the kernel measured: on a loaded machine the handshake's round trip on
    /// loopback can reach milliseconds (a scheduling delay, not a distance), and many agents at once would each open
    /// several connections.
    private func measureRoundTrip(context: ChannelHandlerContext) -> Duration? {
        let kernel = Self.isLoopback(context.channel.remoteAddress) ? Duration.zero : Self.roundTrip(of: context.channel)
        let measured = self.session.configuration.faults.assumedRoundTrip ?? kernel
        return self.meter.map { $0.measured(roundTrip: measured) } ?? measured
    }

    /// Whether `address` is this host's loopback (127.0.0.0/8, ::1, or 127.x mapped into IPv6).
    static func isLoopback(_ address: SocketAddress?) -> Bool {
        guard let ip = address?.ipAddress else { return false }
        return ip.hasPrefix("127.") || ip == "::1" || ip.lowercased().hasPrefix("::ffff:127.")
    }

    /// A run takes this connection, kept up after its quota plan: its queue, pool, limits, meter and events from now on,
    /// its outcome told to `done`. False, with nothing changed, when the connection is gone or was not kept.
    func adopt(
        queue: JobQueue, pool: NIOThreadPool, bandwidth: BandwidthLimit?, meter: LinkMeter?, done: EventLoopPromise<ConnectionOutcome>,
        onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) -> Bool {
        guard let context = self.context, context.channel.isActive, self.done == nil, self.session.outcome.parked, !self.session.closed else {
            return false
        }
        self.session.queue.setListener(ObjectIdentifier(self), nil)
        self.pool = pool
        self.bandwidth = bandwidth
        self.meter = meter
        self.done = done
        self.onEvent = onEvent
        let roundTrip = self.measureRoundTrip(context: context)
        self.act { session in
            session.roundTrip = roundTrip
            return session.adopt(queue)
        }
        self.listen(context: context)
        return true
    }

    /// Closes a connection kept after its quota plan that no run took.
    func letGo() {
        guard self.done == nil, self.session.outcome.parked else { return }
        self.act { $0.close() }
    }

    /// The kernel's smoothed round trip of the connection (TCP_INFO's `tcpi_rtt`, measured from the handshake on), read
    /// on the channel's event loop, where NIO answers at once; nil where it cannot tell.
    static func roundTrip(of channel: any Channel) -> Duration? {
        #if os(Linux)
        guard channel.eventLoop.inEventLoop, let provider = channel as? any SocketOptionProvider else { return nil }
        let answer = NIOLoopBoundBox<Duration?>(nil, eventLoop: channel.eventLoop)
        provider.getTCPInfo().whenSuccess { info in
            if info.tcpi_rtt > 0 { answer.value = .microseconds(Int64(info.tcpi_rtt)) }
        }
        return answer.value
        #else
        return nil
        #endif
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.session.queue.setListener(ObjectIdentifier(self), nil)
        self.act { $0.connectionClosed() }
        context.fireChannelInactive()
    }

    private final class WeakHandler {
        weak var handler: AgentConnectionHandler?
        init(_ handler: AgentConnectionHandler) { self.handler = handler }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.act { $0.transportFailed(TransportFailure(error)) }
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        self.act { $0.silentPeriod() }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.session.received(self.unwrapInboundIn(data))
        while let actions = self.session.nextFrame(now: .now) {
            self.run(actions)
            self.session.noteOwed(now: .now)
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        let writable = context.channel.isWritable
        // Nothing more is read while what was written is not drained: a relay that sends without reading (a PING
        // flood, say) cannot make the agent hold its answers without bound.
        context.channel.setOption(.autoRead, value: writable).whenFailure { _ in }
        self.act { $0.writabilityChanged(writable) }
        context.fireChannelWritabilityChanged()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.flush()
        context.fireChannelReadComplete()
    }

    // MARK: Running actions

    private func run(_ actions: [AgentSession.Action]) {
        for action in actions {
            switch action {
            case .write(let frame):
                guard let context = self.context else { continue }
                var header = context.channel.allocator.buffer(capacity: 64)
                let data = FrameEncoder.encode(frame, into: &header)
                context.write(self.wrapOutboundOut(header), promise: nil)
                self.needsFlush = true
                if let data {
                    self.unflushed += data.readableBytes
                    context.write(self.wrapOutboundOut(data), promise: nil)
                    if self.unflushed >= Self.flushBytes { self.flush() }
                }
            case .close:
                self.flush()
                self.context?.close(promise: nil)
            case .schedule(let timer, let delay):
                self.context?.eventLoop.assumeIsolated().scheduleTask(in: delay) { self.act { $0.timerFired(timer, now: .now) } }
            case .prepare(let job, let dedup, let probe):
                let journal = self.session.queue.journal
                let reopenLimit = self.session.configuration.maxReopensInARow
                let hold = self.session.configuration.heldSourceBytes
                self.onPool({
                    try SourceReader.prepare(
                        job.item.source, info: job.info, knownSHA1: job.knownSHA1, dedup: dedup, probe: probe, reopenLimit: reopenLimit,
                        journal: journal, hold: hold
                    )
                }) {
                    session, result in session.prepared(job, result)
                }
            case .read(let request):
                let bandwidth = self.bandwidth
                if request.held != nil, bandwidth == nil, !request.deflate, let loop = self.context?.eventLoop {
                    // Bytes in memory: CRCs and frames only, no system call, here and now (its outcome on the next turn
                    // of the loop, as the pool's would come).
                    let result = Result { try SourceReader.read(request) }
                    loop.assumeIsolated().execute { self.act { $0.readFinished(request.streamID, result) } }
                    continue
                }
                self.onPool({ try SourceReader.read(request, bandwidth: bandwidth) }) { session, result in
                    session.readFinished(request.streamID, result)
                }
            case .hashPrefix(let id, let source, let from, let offset, let reopening):
                self.onPool({ try SourceReader.hashPrefix(of: source, from: from, upTo: offset, reopening: reopening) }) { session, result in
                    session.prefixHashed(id, result)
                }
            case .event(let event):
                self.onEvent(event)
            case .log(let level, let message, let metadata):
                self.logger.log(level: level, "\(message)", metadata: metadata)
            case .finished(let outcome), .planned(let outcome):
                self.done?.succeed(outcome)
                self.done = nil
            }
        }
    }

    /// Runs source work on the thread pool, then its completion through the session on this loop.
    private func onPool<T: Sendable>(
        _ work: @escaping @Sendable () throws -> T, then input: @escaping (inout AgentSession, Result<T, any Error>) -> [AgentSession.Action]
    ) {
        guard let context = self.context else {
            // Never today (actions start after handlerAdded); should it happen, the session still hears of it.
            self.act { input(&$0, .failure(SourceError("the connection's handler was removed before its source work began"))) }
            return
        }
        self.pool.runIfActive(eventLoop: context.eventLoop, work).assumeIsolated().whenComplete { result in
            self.act { input(&$0, result) }
        }
    }

    private func flush() {
        if self.needsFlush, let context = self.context {
            self.needsFlush = false
            self.unflushed = 0
            context.flush()
        }
    }
}

// Held by its channel and used on its event loop only (NIO handlers are not Sendable).
@available(*, unavailable)
extension AgentConnectionHandler: Sendable {}
