import Logging
import NIOCore
import NIOPosix
import NIOSSL
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
}

/// One connection to the relay: runs the ``AgentConnectionStateMachine`` and the stream senders.
final class AgentConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var machine: AgentConnectionStateMachine
    private var reader = FrameReader()
    private let configuration: AgentConfiguration
    private let queue: JobQueue
    private let pool: NIOThreadPool
    private let onEvent: @Sendable (UploadEvent) -> Void
    private let done: EventLoopPromise<ConnectionOutcome>
    private let logger: Logger
    private var context: ChannelHandlerContext? = nil
    private var senders: [StreamID: StreamSender] = [:]
    private var preparing = 0
    private var outcome = ConnectionOutcome(reason: nil, fatal: false, madeProgress: false)
    private var closed = false
    private var needsFlush = false
    private var deflate = false
    private var goingAway = false
    /// Keepalive periods in a row with nothing received (SPEC §2.3).
    private var silentPeriods = 0
    /// Jobs waiting out a backoff before they are opened again (KEY_BUSY, REFUSED_STREAM).
    private var delayed: [ObjectIdentifier: UploadJob] = [:]

    init(
        configuration: AgentConfiguration, queue: JobQueue, pool: NIOThreadPool, logger: Logger,
        done: EventLoopPromise<ConnectionOutcome>, onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) {
        self.configuration = configuration
        self.queue = queue
        self.pool = pool
        self.logger = logger
        self.done = done
        self.onEvent = onEvent
        self.machine = AgentConnectionStateMachine(limits: configuration.limits)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func channelActive(context: ChannelHandlerContext) {
        let hello = Frame.Hello(
            maxFrameSize: UInt32(self.configuration.limits.maxFrameSize), features: self.configuration.deflate ? .deflate : [],
            credential: Array(self.configuration.token.utf8), agentName: self.configuration.agentName
        )
        self.write(self.machine.sendHello(hello))
        self.flush()
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.closed = true
        for (_, sender) in self.senders {
            sender.stop()
            self.queue.requeue(sender.job)
        }
        self.senders.removeAll()
        for job in self.delayed.values {
            self.queue.requeue(job)
        }
        self.delayed.removeAll()
        if self.outcome.reason == nil && !self.queue.isDone {
            self.outcome.reason = "the relay closed the connection"
        }
        self.done.succeed(self.outcome)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if self.outcome.reason == nil {
            switch error {
            case let tls as NIOSSLError:
                if case .handshakeFailed = tls {
                    let text = "\(tls)"
                    self.outcome.reason = text.contains("CERTIFICATE_VERIFY_FAILED")
                        ? "TLS: the relay's certificate does not verify against the CA given (CERTIFICATE_VERIFY_FAILED); pass the CA that signed it with --ca or UPLOAD_CA"
                        : "TLS handshake with the relay failed: \(text)"
                    self.outcome.fatal = !self.machine.isClosed && self.machine.terms == nil
                } else {
                    self.outcome.reason = "TLS error: \(tls)"
                }
            case let extra as NIOSSLExtraError where extra == .failedToValidateHostname:
                // Not transient: retrying cannot change what the certificate names (issue 6 finding 22).
                let asked = self.configuration.serverName ?? self.configuration.relayHost
                self.outcome.reason =
                    "TLS: the relay's certificate is not valid for \"\(asked)\" (\(extra)); connect by a name or address it holds, pass --server-name NAME with the name it holds, or, for a --dev relay, restart it with --dev-host \(asked)"
                self.outcome.fatal = true
            case let io as IOError:
                self.outcome.reason = "connection lost: \(io)"
            default:
                self.outcome.reason = "connection error: \(error)"
            }
        }
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read, !self.closed else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        self.silentPeriods += 1
        if self.silentPeriods >= 2 {
            // Nothing for two periods, even after a PING (or during the TLS handshake): the link is gone.
            self.outcome.reason = "no answer from the relay for \(self.configuration.keepaliveInterval * 2): the link is dead"
            self.closed = true
            context.close(promise: nil)
        } else if self.machine.terms != nil {
            self.write(.ping(Frame.Ping(data: UInt64.random(in: 0...UInt64.max))))
            self.flush()
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.silentPeriods = 0
        self.reader.append(self.unwrapInboundIn(data))
        while !self.closed {
            let frame: Frame?
            self.reader.maxFrameSize = self.machine.inboundFrameLimit
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
        self.flush()
        context.fireChannelReadComplete()
    }

    // MARK: Actions

    private func run(_ action: AgentAction) {
        switch action {
        case .none:
            break
        case .connected(let welcome):
            self.deflate = welcome.features.contains(.deflate)
            self.onEvent(.connected(relay: "\(self.configuration.relayHost):\(self.configuration.relayPort)", account: welcome.account))
            self.openMore()
        case .offset(let offset):
            self.receivedOffset(offset)
        case .acknowledged(let id, let offset):
            if let sender = self.senders[id] {
                sender.job.acknowledge(offset)
                self.outcome.madeProgress = true
                sender.pump()
            }
        case .creditGranted(let id):
            if id.isConnection {
                for sender in self.senders.values { sender.pump() }
            } else {
                self.senders[id]?.pump()
            }
        case .completed(let result):
            guard let sender = self.senders.removeValue(forKey: result.streamID) else { break }
            let status: UploadResult.Status = .stored
            self.complete(sender.job, sender.job.finish(status, sha1: result.sha1.hex))
        case .streamFailed(let id, let code, let message):
            self.streamFailed(id, code, message)
        case .send(let frame):
            self.write(frame)
        case .resetStream(let error):
            self.write(.error(error))
            self.streamFailed(error.streamID, error.code, "agent reset the stream: \(error.message)")
        case .closeConnection(let error):
            self.outcome.reason = "the relay broke the protocol: \(error.message)"
            self.write(.error(error))
            self.close()
        case .peerClosed(let code, let message):
            self.outcome.reason = "relay closed the connection: \(code.name): \(message)"
            self.outcome.fatal = code == .unauthenticated || code == .unsupportedVersion
            self.close()
        case .goingAway(let goAway):
            self.outcome.reason = "the relay is going away: \(goAway.message)"
            self.goingAway = true
            for (id, sender) in self.senders where id > goAway.lastStreamID {
                sender.stop()
                self.senders[id] = nil
                self.queue.requeue(sender.job)
            }
            self.closeIfIdle()
        }
        self.flush()
    }

    private func receivedOffset(_ offset: Frame.Offset) {
        guard let sender = self.senders[offset.streamID] else { return }
        let job = sender.job
        job.resumeToken = offset.resumeToken
        switch offset.disposition {
        case .stored:
            self.senders[offset.streamID] = nil
            self.complete(job, job.finish(.deduplicated, sha1: job.knownSHA1?.hex ?? ""))
        case .start, .resume:
            job.busySince = nil
            job.busyRetries = 0
            job.acknowledge(offset.offset)
            self.onEvent(.started(key: job.key, size: job.info?.size, offset: offset.offset))
            sender.start(at: offset.offset)
        }
    }

    private func streamFailed(_ id: StreamID, _ code: WireErrorCode, _ message: String) {
        guard let sender = self.senders.removeValue(forKey: id) else { return }
        sender.stop()
        let job = sender.job
        job.lastError = "\(code.name): \(message)"
        // KEY_BUSY and REFUSED_STREAM say "not now" (SPEC §11): they are retried for --retry-for, not counted as attempts.
        let busy = code == .keyBusy || code == .refusedStream
        let now = ContinuousClock.now
        if busy {
            job.busySince = job.busySince ?? now
        } else {
            job.attempts += 1
        }
        // Another upload of the same key (the same files sent twice at once) may take long: KEY_BUSY waits ten times
        // --retry-for; a full relay (REFUSED_STREAM) waits --retry-for.
        let patience = code == .keyBusy ? self.configuration.retryFor * 10 : self.configuration.retryFor
        let retry = busy
            ? now - (job.busySince ?? now) < patience
            : code.isRetryable && job.attempts < self.configuration.maxAttemptsPerItem
        guard retry else {
            self.complete(job, job.finish(.failed, sha1: job.knownSHA1?.hex ?? "", error: "relay refused \"\(job.key)\": \(code.name): \(message)"))
            self.openMore()
            return
        }
        self.logger.info("retrying", metadata: ["upload.key": "\(job.key)", "error": "\(job.lastError!)"])
        if busy, let eventLoop = self.context?.eventLoop {
            // The relay is closing an earlier upload of this key, or is full: wait a little, longer each time.
            job.busyRetries += 1
            let id = ObjectIdentifier(job)
            self.delayed[id] = job
            eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(min(2_000, 50 * Int64(job.busyRetries)))) {
                guard let job = self.delayed.removeValue(forKey: id) else { return }
                self.queue.requeue(job)
                self.openMore()
                self.flush()
            }
        } else {
            self.queue.requeue(job)
        }
        self.openMore()
    }

    private func complete(_ job: UploadJob, _ result: UploadResult) {
        self.outcome.madeProgress = true
        self.queue.finished(result)
        self.onEvent(.finished(result))
        self.openMore()
        self.closeIfIdle()
    }

    /// Opens streams while the relay allows more and jobs wait.
    private func openMore() {
        guard !self.closed, self.context != nil else { return }
        while self.machine.canOpenStream, self.senders.count + self.preparing < self.configuration.concurrency, let job = self.queue.next() {
            self.preparing += 1
            self.prepare(job)
        }
    }

    /// Opens the source and, for dedup, hashes it, off the event loop; then OPEN.
    private func prepare(_ job: UploadJob) {
        let dedup = self.configuration.dedup
        self.pool.runIfActive(eventLoop: self.context!.eventLoop) { () -> (SourceInfo, SHA1Digest?) in
            let info = try job.info ?? job.item.source.open()
            if let known = job.knownSHA1 { return (info, known) }
            guard dedup, job.item.source.isSeekable, let size = info.size else { return (info, nil) }
            var sha1 = SHA1()
            var offset: UInt64 = 0
            let allocator = ByteBufferAllocator()
            while offset < size {
                let piece = try job.item.source.read(at: offset, maxLength: 4 << 20, allocator: allocator)
                guard piece.readableBytes > 0 else { throw SourceError("\(job.item.source.displayName) shrank while it was hashed") }
                piece.withUnsafeReadableBytes { sha1.update($0) }
                offset += UInt64(piece.readableBytes)
            }
            return (info, SHA1Digest(bytes: sha1.finalize()))
        }.assumeIsolated().whenComplete { result in
            self.preparing -= 1
            switch result {
            case .success(let (info, sha1)):
                job.info = info
                job.knownSHA1 = sha1
                guard !self.closed, self.machine.canOpenStream else {
                    self.queue.requeue(job)
                    return
                }
                self.open(job)
            case .failure(let error):
                self.complete(job, job.finish(.failed, sha1: "", error: "\(error)"))
            }
            self.flush()
        }
    }

    private func open(_ job: UploadJob) {
        let id = self.machine.nextStreamID
        let open = Frame.Open(
            streamID: id, key: job.key, size: job.info?.size, sha1: job.knownSHA1, overwrite: self.configuration.overwrite,
            fingerprint: job.info?.fingerprint ?? [], resumeToken: job.resumeToken
        )
        let hooks = StreamSender.Hooks(
            reserve: { [unowned self] id, count in self.machine.reserveCredit(on: id, upTo: count) },
            maxChunkPayload: { [unowned self] in self.machine.maxChunkPayload },
            nextOffset: { [unowned self] id in self.machine.nextOffset(on: id) },
            sendChunks: { [unowned self] id, chunks in
                defer {
                    self.machine.releaseReservation(on: id)
                    self.flush()
                }
                for chunk in chunks {
                    switch self.machine.sendChunk(chunk) {
                    case .send(let frame):
                        self.write(frame)
                        self.onEvent(.sent(key: job.key, bytes: chunk.payloadLength))
                    case .streamGone:
                        return
                    case .refused(let reason):
                        self.failStream(id, "agent bug, upload stopped: \(reason)")
                        return
                    }
                }
            },
            sendHash: { [unowned self] hash in
                switch self.machine.sendHash(hash) {
                case .send(let frame):
                    self.write(frame)
                case .streamGone:
                    break
                case .refused(let reason):
                    self.failStream(hash.streamID, "agent bug, upload stopped: \(reason)")
                }
                self.flush()
            },
            fail: { [unowned self] id, message in
                self.failStream(id, message)
                self.flush()
            }
        )
        let sender = StreamSender(
            id: id, job: job, pool: self.pool, eventLoop: self.context!.eventLoop, configuration: self.configuration,
            deflate: self.deflate, hooks: hooks
        )
        guard let frame = self.machine.sendOpen(open) else {
            self.queue.requeue(job)
            return
        }
        self.senders[id] = sender
        self.write(frame)
    }

    /// Gives up on one upload for a reason of the agent's own (its source failed or changed): CANCEL, and report it.
    private func failStream(_ id: StreamID, _ message: String) {
        if let cancel = self.machine.sendCancel(id, .cancelled, message) {
            self.write(cancel)
        }
        if let sender = self.senders.removeValue(forKey: id) {
            sender.stop()
            self.complete(sender.job, sender.job.finish(.failed, sha1: "", error: message))
        }
    }

    /// Closes once nothing is in flight and nothing more will go out on this connection.
    private func closeIfIdle() {
        guard self.senders.isEmpty, self.preparing == 0, self.delayed.isEmpty else { return }
        if self.queue.isDone || self.goingAway {
            self.close()
        }
    }

    private func write(_ frame: Frame) {
        guard let context = self.context, !self.closed else { return }
        var header = context.channel.allocator.buffer(capacity: 64)
        if let data = FrameEncoder.encode(frame, into: &header) {
            context.write(self.wrapOutboundOut(header), promise: nil)
            context.write(self.wrapOutboundOut(data), promise: nil)
        } else {
            context.write(self.wrapOutboundOut(header), promise: nil)
        }
        self.needsFlush = true
    }

    private func flush() {
        if self.needsFlush, let context = self.context {
            self.needsFlush = false
            context.flush()
        }
    }

    private func close() {
        guard !self.closed, let context = self.context else { return }
        self.flush()
        self.closed = true
        context.close(promise: nil)
    }
}
