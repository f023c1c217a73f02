import NIOCore

/// Sits before TLS and ends a read cycle after every read from the socket.
///
/// NIOSSL decrypts each read into one plaintext buffer per connection and hands the plaintext on only at the end of
/// the read cycle, so that buffer grows to hold every read of a wakeup (``RelayConfiguration/readsPerWakeup``) and
/// keeps that size for the connection's life: 256 KiB with two reads of 64 KiB. Ended after each read, it holds one
/// read's plaintext, so a relay's memory per connection does not grow with ``RelayConfiguration/readsPerWakeup``, at
/// no cost in CPU (docs/benchmarks.md).
///
/// The read cycle's own end is not passed on: each read already ended one.
final class ReadCycleSplitter: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.fireChannelRead(data)
        context.fireChannelReadComplete()
    }

    func channelReadComplete(context: ChannelHandlerContext) {}
}

// Held by its channel and used on its event loop only (NIO handlers are not Sendable).
@available(*, unavailable)
extension ReadCycleSplitter: Sendable {}
