import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// One connection to the status endpoint, behind TLS and NIO's HTTP/1.1 server codec. It reads each request's head, hands it to ``StatusRequest`` and, as a task of the
/// relay's, to ``StatusResponder``, and writes what they decide.
///
/// What one connection may cost is bounded, whoever is at the other end (``StatusEndpoint``):
/// - Requests are answered one at a time, in order. The next is looked at only once the previous answer was written
///   to the socket (its write completed), so at most one answer waits in the channel's buffers.
/// - Reading stops while a request is being answered, while requests wait their turn, or while the channel is not
///   writable: a client that sends and never reads stops being read.
/// - At most ``StatusEndpoint/maxPipelinedRequests`` requests may wait their turn (pipelining); past that the
///   connection closes.
/// - Each request must arrive and be answered, its answer written, within ``StatusEndpoint/requestTimeout`` of the
///   connection opening or of the previous answer's being written; else the connection closes. A body is refused (413),
///   and the connection closed.
final class StatusHTTPHandler: ChannelDuplexHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// A request read whole, waiting for its answer.
    private struct Pending {
        var head: HTTPRequestHead
        /// Bytes of body it came with (refused when more than 0).
        var body: Int
    }

    private let endpoint: StatusEndpoint
    private let responder: StatusResponder
    /// For `/readyz` and `/metrics`.
    private let health: RelayHealth
    /// Where the answers are made.
    private let executor: RelayExecutor
    /// The request being read: its head and the body bytes so far.
    private var receiving: Pending?
    /// Requests read whole, oldest first, waiting for the one being answered.
    private var waiting = CircularBuffer<Pending>(initialCapacity: 4)
    /// A request's answer is being made or written.
    private var answering = false
    /// The peer asked to read while reading was held: read once it may again.
    private var readPending = false
    /// Nothing more is read or answered: the connection is closing.
    private var closing = false
    /// The close was asked of the channel: reads go on, only for TLS to see the client's close_notify.
    private var closeIssued = false
    private var deadline: Scheduled<Void>?

    init(endpoint: StatusEndpoint, responder: StatusResponder, health: RelayHealth, executor: RelayExecutor) {
        self.endpoint = endpoint
        self.responder = responder
        self.health = health
        self.executor = executor
    }

    func channelActive(context: ChannelHandlerContext) {
        self.armDeadline(context: context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.closing = true
        self.deadline?.cancel()
        self.deadline = nil
        self.waiting.removeAll()
        context.fireChannelInactive()
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { self.armDeadline(context: context) }
    }

    // MARK: Reading

    func read(context: ChannelHandlerContext) {
        // Once closed, reads go on: TLS must see the client's close_notify to end at once (what they bring is dropped).
        guard self.closeIssued || self.mayRead(context: context) else {
            self.readPending = true
            return
        }
        context.read()
    }

    /// Closes the connection (TLS first sends close_notify), and reads on so that the client's is seen at once.
    private func close(context: ChannelHandlerContext) {
        self.closing = true
        guard !self.closeIssued else { return }
        self.closeIssued = true
        self.waiting.removeAll()
        context.close(promise: nil)
        if self.readPending {
            self.readPending = false
            context.read()
        }
    }

    /// Whether the socket may be read now: nothing being answered or waiting its turn, and room to write an answer.
    private func mayRead(context: ChannelHandlerContext) -> Bool {
        !self.closing && !self.answering && self.waiting.isEmpty && context.channel.isWritable
    }

    private func readIfPending(context: ChannelHandlerContext) {
        guard self.readPending, self.mayRead(context: context) else { return }
        self.readPending = false
        context.read()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        self.readIfPending(context: context)
        context.fireChannelWritabilityChanged()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !self.closing else { return }
        switch self.unwrapInboundIn(data) {
        case .head(let head):
            self.receiving = Pending(head: head, body: 0)
        case .body(let bytes):
            guard var request = self.receiving else { return }
            request.body += bytes.readableBytes
            self.receiving = request
            if request.body > self.endpoint.maxBody {
                // Not read further: the refusal goes in its turn, then the connection closes.
                self.receiving = nil
                self.enqueue(request, context: context)
                self.closing = true
            }
        case .end:
            guard let request = self.receiving else { return }
            self.receiving = nil
            self.enqueue(request, context: context)
        }
    }

    private func enqueue(_ request: Pending, context: ChannelHandlerContext) {
        guard self.waiting.count < self.endpoint.maxPipelinedRequests else {
            // More requests sent ahead than one connection may have waiting: a client that does not wait for answers.
            self.close(context: context)
            return
        }
        self.waiting.append(request)
        if Self.asksToSwitch(request.head) {
            // The HTTP codec reads nothing after such a request: refused in its turn, and nothing more is taken.
            self.closing = true
        }
        self.answerNext(context: context)
    }

    /// CONNECT, or an Upgrade: the status endpoint serves plain requests only.
    static func asksToSwitch(_ head: HTTPRequestHead) -> Bool {
        head.method == .CONNECT || head.headers.contains(name: "upgrade")
    }

    // MARK: Answering

    /// Answers the oldest waiting request, unless one is being answered.
    private func answerNext(context: ChannelHandlerContext) {
        guard !self.answering, context.channel.isActive, let request = self.waiting.popFirst() else { return }
        self.answering = true
        if request.body > 0 {
            self.answer(context: context, head: request.head, refusal: Self.bodyRefused, keepAlive: false)
            return
        }
        if Self.asksToSwitch(request.head) {
            self.answer(context: context, head: request.head, refusal: Self.switchRefused, keepAlive: false)
            return
        }
        let head = request.head
        let path = head.uri.prefix { $0 != "?" }
        let routes = self.endpoint.routes
        let operation: OperationsRoute?
        switch path {
        case "/healthz" where routes.contains(.health): operation = .alive
        case "/readyz" where routes.contains(.health): operation = .ready
        case "/metrics" where routes.contains(.metrics): operation = .metrics
        default: operation = nil
        }
        if let operation {
            self.answer(context: context, head: head, operation: operation)
            return
        }
        guard routes.contains(.status) else {
            let served = (routes.contains(.metrics) ? ["/metrics"] : []) + ["/healthz", "/readyz"]
            let refusal = StatusRefusal(.notFound, "nothing is served at \(path.prefix(200)): this listener serves \(served.joined(separator: ", "))")
            self.answer(context: context, head: head, refusal: refusal, keepAlive: head.isKeepAlive)
            return
        }
        let parsed: StatusRequest
        do {
            parsed = try StatusRequest.parse(
                method: head.method.rawValue, uri: head.uri, authorization: head.headers[canonicalForm: "authorization"].map(String.init),
                maxListed: self.endpoint.maxListed
            )
        } catch {
            self.answer(context: context, head: head, refusal: error, keepAlive: head.isKeepAlive)
            return
        }
        let responder = self.responder
        self.executor.task(on: context.eventLoop) { () -> Result<[UInt8], StatusRefusal> in
            do throws(StatusRefusal) {
                return .success(try await responder.respond(to: parsed))
            } catch {
                return .failure(error)
            }
        }.assumeIsolated().whenSuccess { outcome in
            switch outcome {
            case .success(let body):
                self.answer(context: context, head: head, status: nil, body: body, keepAlive: head.isKeepAlive)
            case .failure(let refusal):
                self.answer(context: context, head: head, refusal: refusal, keepAlive: head.isKeepAlive)
            }
        }
    }

    /// The operations endpoint's paths.
    private enum OperationsRoute {
        case alive, ready, metrics
    }

    /// `/healthz` at once; `/readyz` and `/metrics` once the catalog answered (``CatalogProbe``).
    private func answer(context: ChannelHandlerContext, head: HTTPRequestHead, operation: OperationsRoute) {
        guard head.method == .GET || head.method == .HEAD else {
            let refusal = StatusRefusal(
                .methodNotAllowed, "\(head.method.rawValue) is not served: \(head.uri.prefix(100)) is read-only (GET or HEAD)")
            self.answer(context: context, head: head, refusal: refusal, keepAlive: head.isKeepAlive)
            return
        }
        let health = self.health
        switch operation {
        case .alive:
            self.answer(context: context, head: head, status: nil, body: Array("{\"alive\":true}\n".utf8), keepAlive: head.isKeepAlive)
            return
        case .ready, .metrics:
            break
        }
        // The catalog is read within a deadline (CatalogProbe): a hung catalog does not hang the probe, and its reads
        // do not pile up.
        let answer: EventLoopFuture<(StatusRefusal.Code?, [UInt8])>
        if case .metrics = operation {
            answer = health.scrapeMetrics(on: context.eventLoop).map { (nil, $0) }
        } else {
            answer = health.readiness(on: context.eventLoop).map { ($0.ready ? nil : .unavailable, $0.json) }
        }
        answer.assumeIsolated().whenComplete { outcome in
            switch outcome {
            case .success(let (status, body)):
                let contentType = operation == .metrics ? RelayMetrics.contentType : Self.jsonType
                self.answer(context: context, head: head, status: status, body: body, contentType: contentType, keepAlive: head.isKeepAlive)
            case .failure:
                self.answer(context: context, head: head, refusal: StatusRefusal(.unavailable, "the relay is stopping"), keepAlive: false)
            }
        }
    }

    static let jsonType = "application/json; charset=utf-8"

    /// Answers with the refusal's status and its reason as JSON.
    private func answer(context: ChannelHandlerContext, head: HTTPRequestHead, refusal: StatusRefusal, keepAlive: Bool) {
        self.answer(context: context, head: head, status: refusal.code, body: Self.errorBody(refusal), keepAlive: keepAlive)
    }

    /// Writes an answer (`status` nil: 200; HEAD: its headers only); once it is written, the next request's turn comes,
    /// or the connection closes.
    private func answer(
        context: ChannelHandlerContext, head: HTTPRequestHead, status: StatusRefusal.Code?, body: [UInt8], contentType: String = jsonType,
        keepAlive: Bool
    ) {
        guard context.channel.isActive else { return }
        let keepAlive = keepAlive && !self.closing
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: contentType)
        headers.add(name: "cache-control", value: "no-store")
        headers.add(name: "content-length", value: String(body.count))
        switch status {
        case .unauthorized?: headers.add(name: "www-authenticate", value: "Bearer realm=\"upload-relay\"")
        case .methodNotAllowed?: headers.add(name: "allow", value: "GET, HEAD")
        default: break
        }
        if !keepAlive { headers.add(name: "connection", value: "close") }
        let responseStatus = status.map { HTTPResponseStatus(statusCode: $0.rawValue) } ?? .ok
        context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: responseStatus, headers: headers))), promise: nil)
        if head.method != .HEAD {
            context.write(self.wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: body)))), promise: nil)
        }
        let written = context.writeAndFlush(self.wrapOutboundOut(.end(nil)))
        written.assumeIsolated().whenComplete { result in
            guard keepAlive, case .success = result else {
                self.close(context: context)
                return
            }
            // In the socket: the next request's turn, with a new deadline.
            self.answering = false
            self.armDeadline(context: context)
            if self.waiting.isEmpty {
                self.readIfPending(context: context)
            } else {
                self.answerNext(context: context)
            }
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let wasClosing = self.closing
        self.closing = true
        // A request the HTTP codec could not read: refused with the reason, as every refusal is, unless an answer is
        // under way (then the connection just closes). TLS failures and resets: nothing to answer.
        if let parser = error as? HTTPParserError, !wasClosing, !self.answering, context.channel.isActive {
            self.answering = true
            self.waiting.removeAll()
            let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/")
            self.answer(context: context, head: head, refusal: self.unreadable(parser), keepAlive: false)
            return
        }
        self.close(context: context)
    }

    /// What a request the codec refused is told.
    func unreadable(_ error: HTTPParserError) -> StatusRefusal {
        switch error {
        case .headerOverflow:
            return StatusRefusal(
                .badRequest,
                "the request head is too long (at most \(self.endpoint.maxHeadBytes) bytes of URI and headers, \(self.endpoint.maxHeaders) headers)"
            )
        default:
            return StatusRefusal(.badRequest, "the request is not readable HTTP/1.1 (\(error))")
        }
    }

    private func armDeadline(context: ChannelHandlerContext) {
        self.deadline?.cancel()
        self.deadline = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(self.endpoint.requestTimeout)) {
            self.close(context: context)
        }
    }

    static let bodyRefused = StatusRefusal(.payloadTooLarge, "status requests carry no body")
    static let switchRefused = StatusRefusal(.badRequest, "the status endpoint serves plain GET and HEAD requests: no CONNECT, no Upgrade")

    static func errorBody(_ refusal: StatusRefusal) -> [UInt8] {
        // JSONSerialization escapes what the message holds (a key may hold quotes).
        let object = ["error": refusal.message]
        return (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])).map(Array.init) ?? []
    }
}

// Held by its channel and used on its event loop only (NIO handlers are not Sendable).
@available(*, unavailable)
extension StatusHTTPHandler: Sendable {}
