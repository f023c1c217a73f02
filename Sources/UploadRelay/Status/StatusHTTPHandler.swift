import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// One connection to the status endpoint, behind TLS and NIO's HTTP/1.1 server pipeline (which answers unreadable
/// requests 400 and holds pipelined requests until the one before is answered). It reads each request's head, hands
/// it to ``StatusRequest`` and, on the I/O pool, to ``StatusResponder``, and writes what they decide.
///
/// A request must arrive whole within ``StatusEndpoint/requestTimeout`` of the connection opening or of the previous
/// answer; a body is refused, past ``StatusEndpoint/maxBody`` with the connection.
final class StatusHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private enum State {
        /// Between requests.
        case idle
        /// A request's head came; `body` bytes of body since.
        case receiving(HTTPRequestHead, body: Int)
        /// Its answer is being made or written; what else it sends is dropped.
        case answering
    }

    private let endpoint: StatusEndpoint
    private let responder: StatusResponder
    private let threadPool: NIOThreadPool
    private var state = State.idle
    private var deadline: Scheduled<Void>?

    init(endpoint: StatusEndpoint, responder: StatusResponder, threadPool: NIOThreadPool) {
        self.endpoint = endpoint
        self.responder = responder
        self.threadPool = threadPool
    }

    func channelActive(context: ChannelHandlerContext) {
        self.armDeadline(context: context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.deadline?.cancel()
        self.deadline = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch (self.unwrapInboundIn(data), self.state) {
        case (.head(let head), .idle):
            self.state = .receiving(head, body: 0)
        case (.body(let bytes), .receiving(let head, let body)):
            let body = body + bytes.readableBytes
            self.state = .receiving(head, body: body)
            if body > self.endpoint.maxBody {
                self.state = .answering
                self.refuse(context: context, head: head, Self.bodyRefused, keepAlive: false)
            }
        case (.end, .receiving(let head, let body)):
            self.state = .answering
            self.deadline?.cancel()
            self.deadline = nil
            if body > 0 {
                self.refuse(context: context, head: head, Self.bodyRefused, keepAlive: false)
                return
            }
            self.dispatch(context: context, head: head)
        case (.head, _), (.body, _), (.end, _):
            // The rest of a request already answered (refused for its body), or parts out of order: dropped.
            break
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // TLS failures, resets: nothing to answer.
        context.close(promise: nil)
    }

    private func dispatch(context: ChannelHandlerContext, head: HTTPRequestHead) {
        let request: StatusRequest
        do {
            request = try StatusRequest.parse(
                method: head.method.rawValue, uri: head.uri, authorization: head.headers[canonicalForm: "authorization"].map(String.init),
                maxListed: self.endpoint.maxListed
            )
        } catch {
            self.refuse(context: context, head: head, error, keepAlive: head.isKeepAlive)
            return
        }
        let responder = self.responder
        self.threadPool.runIfActive(eventLoop: context.eventLoop) { () -> Result<[UInt8], StatusRefusal> in
            Result { () throws(StatusRefusal) in try responder.respond(to: request) }
        }.assumeIsolated().whenComplete { outcome in
            switch outcome {
            case .success(.success(let body)):
                self.answer(context: context, head: head, status: nil, body: body, keepAlive: head.isKeepAlive)
            case .success(.failure(let refusal)):
                self.refuse(context: context, head: head, refusal, keepAlive: head.isKeepAlive)
            case .failure:
                // The I/O pool stopped: the relay is going away.
                self.refuse(context: context, head: head, StatusRefusal(.unavailable, "the relay is stopping"), keepAlive: false)
            }
        }
    }

    /// Answers with the refusal's status and its reason as JSON.
    private func refuse(context: ChannelHandlerContext, head: HTTPRequestHead, _ refusal: StatusRefusal, keepAlive: Bool) {
        self.answer(context: context, head: head, status: refusal.code, body: Self.errorBody(refusal), keepAlive: keepAlive)
    }

    /// Writes an answer (`status` nil: 200; HEAD: its headers only), then waits for the next request or closes.
    private func answer(context: ChannelHandlerContext, head: HTTPRequestHead, status: StatusRefusal.Code?, body: [UInt8], keepAlive: Bool) {
        guard context.channel.isActive else { return }
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: "application/json; charset=utf-8")
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
        // Ready for the next request before the end goes out: NIO's pipelining handler delivers a request it held
        // back from within that write.
        if keepAlive {
            self.state = .idle
            self.armDeadline(context: context)
        }
        let written = context.writeAndFlush(self.wrapOutboundOut(.end(nil)))
        if !keepAlive {
            written.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        }
    }

    private func armDeadline(context: ChannelHandlerContext) {
        self.deadline?.cancel()
        self.deadline = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(self.endpoint.requestTimeout)) {
            context.close(promise: nil)
        }
    }

    static let bodyRefused = StatusRefusal(.payloadTooLarge, "status requests carry no body")

    static func errorBody(_ refusal: StatusRefusal) -> [UInt8] {
        // JSONSerialization escapes what the message holds (a key may hold quotes).
        let object = ["error": refusal.message]
        return (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])).map(Array.init) ?? []
    }
}
