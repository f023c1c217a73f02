import NIOCore

/// Sits before TLS and ends a read cycle after every read from the socket.
///
/// NIOSSL decrypts each read into one plaintext buffer per connection and hands the plaintext on only at the end of
/// the read cycle, so that buffer grows to hold every read of a wakeup (``RelayConfiguration/readsPerWakeup``) and
/// keeps that size for the connection's life: 256 KiB with two reads of 64 KiB. Ended after each read, it holds one
/// read's plaintext. With 100 agents at once (`tools/bench-many.sh`'s files) the relay's peak resident memory fell
/// from 106-107 to 91-95 MiB where its CPU is the bound, and from 130-134 to 119-127 where storage is, for the same
/// CPU on one 1 GiB upload, 1,000 files of 1 MiB and 10,000 of 16 KiB (alternating A/B runs).
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
