#if canImport(Glibc)
import Glibc
#endif
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import UploadProtocol

/// Uploads items to a relay: one TLS connection (or ``AgentConfiguration/connections`` of them) carrying many streams,
/// reconnecting with backoff when it breaks, and resuming every unfinished item from the relay's durable offset.
public final class Uploader: Sendable {
    public let configuration: AgentConfiguration
    private let group: any EventLoopGroup
    private let logger: Logger
    /// Connections kept up for the run that follows a quota plan (``quotaPlan(_:keepConnection:)``), by the index of
    /// the adaptive run's connection that takes each instead of dialing: 0, the one the plan was asked on (the run's
    /// first); 1 to ``ConnectionGrowth/firstStep`` - 1, those opened beside it on a long link, each with that added
    /// connection's share. Each future succeeds when its connection waits (its ``KeptConnection``), or with nil when it failed.
    private let kept = NIOLockedValueBox<[Int: EventLoopFuture<KeptConnection?>]>([:])
    /// When the quota plan's connection began, and why it ended, when the relay never welcomed it: the run that follows
    /// counts `--retry-for` from then, so an unanswering relay costs one wait, not two.
    private let unanswered = NIOLockedValueBox<(since: ContinuousClock.Instant, reason: String)?>(nil)

    private struct KeptConnection: Sendable {
        let channel: any Channel
        let handler: NIOLoopBound<AgentConnectionHandler>
    }

    /// The ALPN name of protocol v1 (SPEC §2.1).
    public static let alpn = ProtocolLimits.alpn

    public init(configuration: AgentConfiguration, group: any EventLoopGroup, logger: Logger) {
        self.configuration = configuration
        self.group = group
        self.logger = logger
    }

    /// Uploads every item; returns one result per item, in the order they finished.
    /// `onEvent` is called from event-loop threads: keep it quick.
    public func upload(_ items: [UploadItem], onEvent: @escaping @Sendable (UploadEvent) -> Void = { _ in }) async throws -> [UploadResult] {
        let queue = JobQueue(items.map { UploadJob(item: $0) })
        guard !items.isEmpty else { return [] }
        try await self.run(queue, service: false, onEvent: onEvent)
        return queue.results
    }

    /// Why a long-running agent stopped: retrying could not help (a revoked token, the wrong CA).
    public struct Stopped: Error, Hashable, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// Runs the queue's jobs, one connection at a time, reconnecting with backoff. A `send` (`service` false) returns
    /// once every job finished or was given up; a long-running agent waits for more work (and while the queue is
    /// held) until the queue is stopped, and throws ``Stopped`` when retrying cannot help.
    func run(_ queue: JobQueue, service: Bool, onEvent: @escaping @Sendable (UploadEvent) -> Void) async throws {
        let pool = NIOThreadPool(numberOfThreads: self.configuration.ioThreads)
        pool.start()
        // A quota plan's unanswered connection counts for this run only.
        defer { self.unanswered.withLockedValue { $0 = nil } }
        let outcome: Result<Void, any Error>
        do {
            try await withThrowingTaskGroup(of: Void.self) { group in
                // Jobs the relay had no room for come back to the line as their waits end, while the run lasts.
                group.addTask { await queue.returnDeferredJobs() }
                try await self.run(queue, service: service, pool: pool, onEvent: onEvent)
                group.cancelAll()
            }
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        // Waits for source work still running (a read of a stream already cancelled): its completion goes to an event
        // loop, which must still be there. Closed sources end their waits for input.
        queue.closeUnfinishedSources()
        try? await pool.shutdownGracefully()
        try outcome.get()
    }

    private func run(
        _ queue: JobQueue, service: Bool, pool: NIOThreadPool, onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) async throws {
        // HELLO carries the token as it is (SPEC §12.1): a longer one is not a token any relay issued.
        let tokenBytes = self.configuration.token.utf8.count
        guard tokenBytes <= self.configuration.limits.maxCredentialLength else {
            throw SourceError(
                "the token is \(tokenBytes) bytes, longer than the \(self.configuration.limits.maxCredentialLength) a token may have: check --token or UPLOAD_TOKEN"
            )
        }
        let tls = try self.makeTLSContext()
        let bandwidth = self.configuration.bandwidthLimit.map(BandwidthLimit.init(bytesPerSecond:))
        guard self.configuration.adaptiveConnections, self.configuration.connections > 1 else {
            // Each connection has its share of the configuration: none takes the quota plan's, made with the whole.
            await self.letGoOfKeptConnection()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for configuration in Self.connectionShares(self.configuration) {
                    group.addTask {
                        try await self.runConnections(
                            queue, service: service, pool: pool, configuration: configuration, tls: tls, bandwidth: bandwidth, meter: nil,
                            onEvent: onEvent
                        )
                    }
                }
                try await group.waitForAll()
            }
            return
        }
        try await self.runAdaptive(queue, service: service, pool: pool, tls: tls, bandwidth: bandwidth, onEvent: onEvent)
    }

    /// The connections a run opens at its start: one for an adaptive run, else ``AgentConfiguration/connections`` (no
    /// more than the places of ``AgentConfiguration/concurrency``).
    public static func connectionsAtStart(_ configuration: AgentConfiguration) -> Int {
        configuration.adaptiveConnections ? 1 : max(1, min(configuration.connections, configuration.concurrency))
    }

    /// What ends in an adaptive run's task group: a connection's loop (the queue's work is over for it), or a window.
    private enum Ended: Sendable {
        case connections
        case window
    }

    /// An adaptive run (``AgentConfiguration/adaptiveConnections``): one connection with the whole configuration, and
    /// one more at the end of each window while ``ConnectionGrowth`` says so, each with its share
    /// (``addedConnectionShare(_:index:)``). The run ends when every connection's loop ended; a window under way then
    /// is cancelled, so a short run waits for no window.
    private func runAdaptive(
        _ queue: JobQueue, service: Bool, pool: NIOThreadPool, tls: NIOSSLContext, bandwidth: BandwidthLimit?,
        onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) async throws {
        let meter = LinkMeter()
        let counted: @Sendable (UploadEvent) -> Void = { event in
            if case .sent(_, let bytes) = event { meter.sent(bytes) }
            onEvent(event)
        }
        let configuration = self.configuration
        try await withThrowingTaskGroup(of: Ended.self) { group in
            func open(_ share: AgentConfiguration, index: Int) {
                group.addTask {
                    try await self.runConnections(
                        queue, service: service, pool: pool, configuration: share, tls: tls, bandwidth: bandwidth, meter: meter,
                        keptIndex: index, onEvent: counted
                    )
                    return .connections
                }
            }
            func window(_ length: Duration) {
                group.addTask {
                    try? await Task.sleep(for: length)
                    return .window
                }
            }
            var growth = ConnectionGrowth(maximum: configuration.connections, sendBufferLimit: Self.kernelSendBufferLimit())
            var running = 1
            var polls = 0
            // The first connection has the whole configuration, as the quota plan's had: it takes that one when kept.
            open(configuration, index: 0)
            // The first decision comes as soon as the first connection's round trip is known (its TCP handshake
            // measures it): asked every 50 ms until then. On a short link it settles at once.
            window(.milliseconds(50))
            var mark = (sent: meter.sentBytes, at: ContinuousClock.now)
            while let ended = try await group.next() {
                switch ended {
                case .connections:
                    running -= 1
                    if running == 0 { group.cancelAll() }
                case .window where running > 0:
                    let now = ContinuousClock.now
                    let sent = meter.sentBytes
                    let rate = Double(sent - mark.sent) / max((now - mark.at).inSeconds, 0.001)
                    mark = (sent, now)
                    let roundTrip = meter.roundTrip
                    let added = growth.sample(roundTrip: roundTrip, connected: meter.connected, rate: rate, workWaiting: queue.hasWaiting)
                    if added > 0 {
                        for index in growth.running - added..<growth.running {
                            open(Self.addedConnectionShare(configuration, index: index), index: index)
                        }
                        running += added
                        self.logger.info(
                            "\(growth.running) connections of at most \(growth.maximum)",
                            metadata: [
                                "round_trip": "\(roundTrip ?? .zero)",
                                "rate_before": "\(growth.running - added == 1 ? "not measured" : "\(Int(rate)) B/s")",
                            ]
                        )
                        onEvent(.connections(count: growth.running, reason: "a round trip of \(roundTrip ?? .zero)"))
                    }
                    if growth.settled {
                        self.logger.debug("connections settled", metadata: ["count": "\(growth.running)", "reason": "\(growth.reason ?? "")"])
                    } else {
                        // Until the first connection is up: every 50 ms for two seconds, then every second (a relay
                        // that cannot be reached yet).
                        polls += 1
                        window(roundTrip == nil ? (polls < 40 ? .milliseconds(50) : .seconds(1)) : ConnectionGrowth.window(roundTrip: roundTrip))
                    }
                case .window:
                    break
                }
            }
        }
    }

    /// The largest send buffer the kernel gives a TCP connection (the last of `net.ipv4.tcp_wmem`'s three numbers, in
    /// the agent's network namespace); 4 MiB, Linux's default, where it cannot be read.
    static func kernelSendBufferLimit() -> Int {
        let fallback = 4 << 20
        guard let file = fopen("/proc/sys/net/ipv4/tcp_wmem", "r") else { return fallback }
        defer { fclose(file) }
        var line = [CChar](repeating: 0, count: 128)
        guard fgets(&line, Int32(line.count), file) != nil else { return fallback }
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.split(whereSeparator: \.isWhitespace).last.flatMap { Int($0) }.flatMap { $0 > 0 ? $0 : nil } ?? fallback
    }

    /// The configuration of connection `index` (1 or more) that an adaptive run adds: the share a fixed run of
    /// ``AgentConfiguration/connections`` would give it (256 KiB chunks, a part of the write buffer and of the reads),
    /// with ``addedConnectionConcurrency`` places whatever the configured total: the first connection keeps the whole
    /// of it, and each added one sends one upload, or one stripe, while the next opens (the bytes it holds to send
    /// decide when, ``AgentSession/balancedBytes``).
    static func addedConnectionShare(_ configuration: AgentConfiguration, index: Int) -> AgentConfiguration {
        var wide = configuration
        wide.concurrency = max(configuration.concurrency, configuration.connections)
        let shares = Self.connectionShares(wide)
        var share = shares[min(index, shares.count - 1)]
        share.concurrency = min(Self.addedConnectionConcurrency, max(1, configuration.concurrency))
        return share
    }

    /// The places of ``AgentConfiguration/concurrency`` of each connection an adaptive run adds (no more than
    /// `--concurrency` itself).
    static let addedConnectionConcurrency = 2

    /// The configuration of each of ``AgentConfiguration/connections``: ``AgentConfiguration/concurrency``, the reads
    /// in flight and the bytes waiting for the sockets shared among them, so that the agent's memory stays about what
    /// one connection takes (none gets less than one place, one read and a chunk's worth of buffer, so there are never
    /// more connections than places).
    static func connectionShares(_ configuration: AgentConfiguration) -> [AgentConfiguration] {
        let count = max(1, min(configuration.connections, configuration.concurrency))
        func part(of total: Int, _ index: Int) -> Int {
            total / count + (index < total % count ? 1 : 0)
        }
        return (0..<count).map { index in
            var share = configuration
            // How many connections run: each stripes a large file only when others can carry its stripes (SPEC §6.7).
            share.connections = count
            share.concurrency = max(1, part(of: configuration.concurrency, index))
            share.maxReadsInFlight = max(1, part(of: configuration.maxReadsInFlight, index))
            // A connection's buffers hold a chunk or two (its TLS buffer, a write the socket has not taken): chunks
            // shrink with the connections, down to ``smallestSharedChunk``, so that 4 connections take about the memory
            // of one (with 1 MiB chunks they took 2.4 MiB each: 51 MiB of agent on a long fat link).
            share.chunkSize = Self.sharedChunkSize(configuration.chunkSize, connections: count)
            share.tlsBufferBytes = share.chunkSize + max(0, configuration.tlsBufferBytes - configuration.chunkSize)
            share.writeBufferBytes = max(share.chunkSize, part(of: configuration.writeBufferBytes, index))
            // The bytes of reads in flight, together, stay what one connection reads at once: a connection that gets
            // one read of several reads with a smaller batch (never below a chunk).
            let readBytes = configuration.maxReadsInFlight * configuration.readBatchBytes / count / share.maxReadsInFlight
            share.readBatchBytes = min(configuration.readBatchBytes, max(share.chunkSize, readBytes / (64 << 10) * (64 << 10)))
            return share
        }
    }

    /// Chunks are never shrunk below this for sharing (more frames cost CPU; 256 KiB is still 16 TLS records).
    static let smallestSharedChunk = 256 << 10

    /// The chunk size of each of `connections`: `chunkSize` divided among them, in whole 64 KiB, never below
    /// ``smallestSharedChunk`` (nor above `chunkSize`).
    static func sharedChunkSize(_ chunkSize: Int, connections: Int) -> Int {
        guard connections > 1 else { return chunkSize }
        let divided = chunkSize / connections / (64 << 10) * (64 << 10)
        return min(chunkSize, max(Self.smallestSharedChunk, divided))
    }

    /// One connection at a time, reconnecting with backoff, until the queue's work is over.
    private func runConnections(
        _ queue: JobQueue, service: Bool, pool: NIOThreadPool, configuration: AgentConfiguration, tls: NIOSSLContext,
        bandwidth: BandwidthLimit?, meter: LinkMeter?, keptIndex: Int? = nil, onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) async throws {
        var keptIndex = keptIndex
        let clock = ContinuousClock()
        var earlier = self.unanswered.withLockedValue { $0 }
        var deadline: ContinuousClock.Instant? = earlier.map { $0.since + configuration.retryFor }
        var backoff = Duration.milliseconds(200)
        var mark = queue.progressMark
        // Whether a relay ever welcomed a connection of this run: giving up then is NO_PROGRESS, else RELAY_UNREACHABLE.
        var welcomed = false
        while await queue.waitForWork(service: service) {
            if let unanswered = earlier.take(), let passed = deadline, clock.now >= passed, !configuration.retryForever {
                // The quota plan's connection already waited for this relay for --retry-for.
                let reason = "gave up after \(configuration.retryFor) without progress: \(unanswered.reason)"
                for result in queue.failWaiting(reason, code: UploadResult.ErrorCode.relayUnreachable) {
                    onEvent(.finished(result))
                }
                if service { continue }
                break
            }
            let started = clock.now
            let outcome: ConnectionOutcome
            // The first attempt only: a reconnection is a connection of its own.
            var kept: EventLoopFuture<ConnectionOutcome>? = nil
            if let index = keptIndex.take(), let connection = self.kept.withLockedValue({ $0.removeValue(forKey: index) }) {
                kept = await self.adoptKept(
                    try? await connection.get(), queue: queue, pool: pool, bandwidth: bandwidth, meter: meter, onEvent: onEvent)
            }
            do {
                if let kept {
                    outcome = try await kept.get()
                } else {
                    outcome = try await self.startConnection(
                        queue: queue, pool: pool, configuration: configuration, bandwidth: bandwidth, tls: tls, meter: meter, onEvent: onEvent
                    ).get()
                }
            } catch {
                outcome = ConnectionOutcome(
                    reason: Self.describe(connectError: error, configuration: configuration), fatal: false, madeProgress: false)
            }
            welcomed = welcomed || outcome.welcomed
            if queue.isDone || queue.holdReason != nil || queue.hasOnlyDeferred {
                // All done (a long-running agent waits for more), paused, or only items waiting for the relay to have
                // room (they come back by themselves): the next connection starts afresh.
                deadline = nil
                backoff = .milliseconds(200)
                continue
            }
            let reason = outcome.reason ?? "connection closed"
            if outcome.fatal {
                for result in queue.failWaiting(reason, code: outcome.code ?? UploadResult.ErrorCode.failed) { onEvent(.finished(result)) }
                if service { throw Stopped(description: reason) }
                break
            }
            // The queue's progress, not only this connection's: with --connections this one may only be refused (a
            // relay at its connection limit) while the others carry the queue.
            let progressed = queue.progressMark != mark
            mark = queue.progressMark
            if progressed || deadline == nil {
                deadline = (progressed ? clock.now : started) + configuration.retryFor
                if outcome.madeProgress { backoff = .milliseconds(200) }
            }
            if let deadline, clock.now >= deadline, !configuration.retryForever {
                let code = outcome.code ?? (welcomed ? UploadResult.ErrorCode.noProgress : UploadResult.ErrorCode.relayUnreachable)
                for result in queue.failWaiting("gave up after \(configuration.retryFor) without progress: \(reason)", code: code) {
                    onEvent(.finished(result))
                }
                if service { continue }
                break
            }
            onEvent(.reconnecting(reason: reason, delay: backoff))
            try await Task.sleep(for: backoff)
            backoff = min(backoff * 2, configuration.maxBackoff)
        }
    }

    private func makeTLSContext() throws -> NIOSSLContext {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv13
        tls.applicationProtocols = [Self.alpn]
        // A connection the agent closes has nothing left to hear (every RESULT is in, or it is given up): its
        // close_notify goes out and the socket closes, without waiting for the relay's (TLS 1.3 allows it, RFC 8446
        // §6.1). Waiting would make every send a round trip longer.
        tls.shutdownTimeout = .zero
        // The chain is verified here, the name by ServerIdentityCheck: NIOSSL's own name check also passes any
        // certificate that lists the address connected to, whatever name the user asked for.
        tls.certificateVerification = .noHostnameVerification
        if let ca = self.configuration.caPath {
            guard access(ca, R_OK) == 0 else {
                throw SourceError(
                    "cannot read the CA certificate \(ca): \(String(cString: strerror(errno))) (--ca or UPLOAD_CA must name a PEM file)")
            }
            let certificates = (try? NIOSSLCertificate.fromPEMFile(ca)) ?? []
            guard !certificates.isEmpty else {
                throw SourceError(
                    "the CA certificate \(ca) is not a PEM certificate (-----BEGIN CERTIFICATE-----); pass the relay's CA, e.g. its dev/ca.pem")
            }
            tls.trustRoots = .certificates(certificates)
        }
        return try NIOSSLContext(configuration: tls)
    }

    private static func isIPAddress(_ host: String) -> Bool {
        (try? SocketAddress(ipAddress: host, port: 0)) != nil
    }

    /// Asks the relay, on one connection of its own, what uploading a selection would add to the account's quota use
    /// (SPEC §7.2). Nil when the relay does not answer quota plans; throws when the connection fails (no retry: the
    /// upload that follows has its own).
    ///
    /// With `keepConnection` the connection stays up after the answer, idle, and the first connection of the run that
    /// follows (an adaptive one, the default) takes it: four round trips saved (TCP, TLS, HELLO, and PLAN's own, 0.4 s
    /// over 100 ms). ``letGoOfKeptConnection()`` closes it when no run takes it.
    ///
    /// Kept, on a long link, in an adaptive run, for a selection ``ConnectionGrowth/worthWarming(bytes:sendBufferLimit:)``:
    /// the run's first step is known already (its connections open as soon as the round trip is, ``ConnectionGrowth``),
    /// so they open here, as soon as this connection's TCP handshake measured the round trip, and wait once welcomed
    /// for the run to take them: their TCP, TLS and HELLO round trips pass while the plan is asked, not after.
    public func quotaPlan(_ request: QuotaPlan.Request, keepConnection: Bool = false) async throws -> QuotaPlan? {
        await self.letGoOfKeptConnection()
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        defer { pool.shutdownGracefully { _ in } }
        let made = NIOLockedValueBox<KeptConnection?>(nil)
        let tls = try self.makeTLSContext()
        let configuration = self.configuration
        let bytes = request.entries.reduce(UInt64(0)) { $0 &+ $1.size }
        let warmUp =
            keepConnection && configuration.adaptiveConnections && configuration.connections > 1
            && ConnectionGrowth.worthWarming(bytes: bytes, sendBufferLimit: Self.kernelSendBufferLimit())
        let meter = warmUp ? LinkMeter(whenMeasured: { self.warmUp(roundTrip: $0, pool: pool, tls: tls) }) : nil
        let started = ContinuousClock.now
        self.unanswered.withLockedValue { $0 = nil }
        let outcome = try await self.startConnection(
            queue: JobQueue([]), pool: pool, configuration: configuration, bandwidth: nil, tls: tls, plan: request,
            keepAfterPlan: keepConnection, made: made, meter: meter, onEvent: { _ in }
        ).get()
        if outcome.parked, let made = made.withLockedValue({ $0 }) {
            self.kept.withLockedValue { $0[0] = made.channel.eventLoop.makeSucceededFuture(made) }
        }
        if outcome.quotaPlan == nil, let reason = outcome.reason {
            if !outcome.welcomed { self.unanswered.withLockedValue { $0 = (started, reason) } }
            throw SourceError(reason)
        }
        return outcome.quotaPlan
    }

    /// Opens the first step's added connections (all but the first), each waiting once welcomed, when the round trip
    /// the quota plan's connection measured makes the link long.
    private func warmUp(roundTrip: Duration?, pool: NIOThreadPool, tls: NIOSSLContext) {
        guard let roundTrip, roundTrip >= ConnectionGrowth.longLink else { return }
        let configuration = self.configuration
        let count = min(ConnectionGrowth.firstStep, configuration.connections)
        guard count > 1 else { return }
        self.logger.debug("opening connections beside the quota plan's", metadata: ["count": "\(count - 1)", "round_trip": "\(roundTrip)"])
        self.kept.withLockedValue { kept in
            for index in 1..<count where kept[index] == nil {
                let made = NIOLockedValueBox<KeptConnection?>(nil)
                // Started from an event loop's task, not under this lock.
                kept[index] = self.group.any().flatSubmit {
                    self.startConnection(
                        queue: JobQueue([]), pool: pool, configuration: Self.addedConnectionShare(configuration, index: index), bandwidth: nil,
                        tls: tls, keepAfterPlan: true, made: made, onEvent: { _ in }
                    )
                }.map { outcome in
                    outcome.parked ? made.withLockedValue { $0 } : nil
                }.recover { _ in nil }
            }
        }
    }

    /// Closes the connection kept after a quota plan, and those opened beside it, if no run took them.
    public func letGoOfKeptConnection() async {
        let connections = self.kept.withLockedValue { kept in
            defer { kept = [:] }
            return Array(kept.values)
        }
        for connection in connections {
            guard let kept = try? await connection.get() else { continue }
            try? await kept.channel.eventLoop.submit { kept.handler.value.letGo() }.get()
        }
    }

    /// A kept connection, taken by a run for `queue`: its outcome, to be awaited; nil when none is kept, or it is gone.
    private func adoptKept(
        _ kept: KeptConnection?, queue: JobQueue, pool: NIOThreadPool, bandwidth: BandwidthLimit?, meter: LinkMeter?,
        onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) async -> EventLoopFuture<ConnectionOutcome>? {
        guard let kept else { return nil }
        let loop = kept.channel.eventLoop
        let promise = loop.makePromise(of: ConnectionOutcome.self)
        let taken = try? await loop.submit {
            kept.handler.value.adopt(queue: queue, pool: pool, bandwidth: bandwidth, meter: meter, done: promise, onEvent: onEvent)
        }.get()
        guard taken == true else {
            promise.fail(ChannelError.alreadyClosed)
            kept.channel.close(promise: nil)
            self.logger.debug("the connection kept after the quota plan is gone: connecting anew")
            return nil
        }
        return promise.futureResult
    }

    /// Connects, and succeeds with the connection's outcome once it ended (or is parked, kept after a quota plan).
    private func startConnection(
        queue: JobQueue, pool: NIOThreadPool, configuration: AgentConfiguration, bandwidth: BandwidthLimit?, tls: NIOSSLContext,
        plan: QuotaPlan.Request? = nil, keepAfterPlan: Bool = false, made: NIOLockedValueBox<KeptConnection?>? = nil, meter: LinkMeter? = nil,
        onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) -> EventLoopFuture<ConnectionOutcome> {
        let logger = self.logger
        let host = configuration.relayHost
        let serverName = configuration.serverName ?? (Self.isIPAddress(host) ? nil : host)
        let identity = ServerIdentityCheck.expected(host: host, serverName: configuration.serverName)
        let promise = self.group.any().makePromise(of: ConnectionOutcome.self)
        let bootstrap = ClientBootstrap(group: self.group)
            .connectTimeout(.seconds(10))
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelOption(
                .writeBufferWaterMark,
                value: .init(low: max(1, configuration.writeBufferBytes / 2), high: max(1, configuration.writeBufferBytes))
            )
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    // In front of TLS: any bytes at all, handshake included, prove the link alive.
                    try sync.addHandler(IdleStateHandler(readTimeout: TimeAmount(configuration.keepaliveInterval)))
                    var tlsConfiguration = NIOSSLHandler.Configuration()
                    tlsConfiguration.maximumPreservedOutboundBufferCapacity = configuration.tlsBufferBytes
                    try sync.addHandler(
                        NIOSSLClientHandler(context: tls, serverHostname: serverName, configuration: tlsConfiguration)
                    )
                    try sync.addHandler(ServerIdentityCheck(expected: identity))
                    let handler = AgentConnectionHandler(
                        configuration: configuration, queue: queue, pool: pool, bandwidth: bandwidth, logger: logger, done: promise,
                        plan: plan, keepAfterPlan: keepAfterPlan, meter: meter, onEvent: onEvent
                    )
                    try sync.addHandler(handler)
                    made?.withLockedValue { $0 = KeptConnection(channel: channel, handler: NIOLoopBound(handler, eventLoop: channel.eventLoop)) }
                }
            }
        logger.debug("connecting", metadata: ["relay": "\(host):\(configuration.relayPort)"])
        bootstrap.connect(host: host, port: configuration.relayPort).whenFailure { error in
            logger.info("could not connect", metadata: ["relay": "\(host):\(configuration.relayPort)", "error": "\(error)"])
            // Never active, so the handler will not report: this is the only completion.
            promise.fail(error)
        }
        return promise.futureResult
    }

    /// One line that names the relay's address, what went wrong and what to check: a person on a device acts on it,
    /// where NIO's own description of its connection attempts ran to several lines of internals.
    static func describe(connectError error: any Error, configuration: AgentConfiguration) -> String {
        let address = "\(configuration.relayHost):\(configuration.relayPort)"
        return "cannot connect to the relay at \(address): " + Self.reason(connectError: error, host: configuration.relayHost)
    }

    static func reason(connectError error: any Error, host: String) -> String {
        let timedOut = "no answer within 10 s: a firewall in the way, or the wrong address?"
        let unresolved = "cannot resolve \"\(host)\" (check the name in --relay, or the device's DNS)"
        func errnoReason(_ code: Int32) -> String? {
            switch code {
            case ECONNREFUSED: return "connection refused: is upload-relay running and listening there (--relay host:port)?"
            case ETIMEDOUT: return "no answer: a firewall in the way, or the wrong address?"
            case ENETUNREACH, EHOSTUNREACH: return "no route to that host: is this device on the network?"
            case ECONNRESET: return "the connection was reset: something in between closed it"
            default: return nil
            }
        }
        switch error {
        case let error as NIOConnectionError:
            let attempts = error.connectionErrors.map(\.error)
            if attempts.isEmpty, error.dnsAError != nil || error.dnsAAAAError != nil {
                return unresolved
            }
            for attempt in attempts {
                if let io = attempt as? IOError, let reason = errnoReason(io.errnoCode) { return reason }
                if case ChannelError.connectTimeout = attempt { return timedOut }
            }
            return attempts.first.map { "\($0)" } ?? "no address to connect to"
        case let error as IOError:
            return errnoReason(error.errnoCode) ?? "\(error)"
        case ChannelError.connectTimeout:
            return timedOut
        case is SocketAddressError.UnknownHost:
            // What NIO's resolver throws now; `.unknown` below is what it threw before.
            return unresolved
        case let error as SocketAddressError:
            if case .unknown = error { return unresolved }
            return "\(error)"
        default:
            return "\(error)"
        }
    }
}
