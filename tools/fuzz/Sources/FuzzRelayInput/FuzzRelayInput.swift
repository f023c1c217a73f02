// What one fuzz input runs: arbitrary bytes from an agent, cut into reads of a size the input picks, go to the relay's
// real RelaySession through UploadTestSupport's RelayDriver, the same driver the in-memory tests use: the real catalog
// (SQLite), store, upload pipeline and policy, in a temporary directory, with every storage step run at once.
//
// What counts as a bug: any crash or trap (a relay crash drops every upload on it), a decoder error that is not a
// ProtocolError, a decoded frame that does not survive encode + decode, or a connection that ends holding a key claim,
// an upload slot or memory.

import NIOCore
import UploadProtocol
import UploadTestSupport

/// One relay for the whole run: the seeds' HELLOs carry this token (protocol/vectors/valid/hello*.json).
let backend = try! RelayBackend(tokens: ["tok-0123456789": "fuzz"])

func fuzzRelayInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let piece = Int(data[0]) * 61 + 1
    var relay = RelayDriver(backend: backend)
    _ = relay.start()
    var frames = FrameReader()
    var offset = 1
    while offset < size && !relay.closed {
        let n = min(piece, size - offset)
        let bytes = ByteBuffer(bytes: UnsafeBufferPointer(start: data + offset, count: n))
        checkRoundTrips(bytes, reader: &frames, limit: relay.machine.inboundFrameLimit)
        var input = bytes
        _ = relay.receive(&input)
        offset += n
    }
    // Time passes: sync timers, the drain, the idle timeout.
    _ = relay.advance(by: .seconds(300))
    relay.connectionClosed()
    precondition(!backend.holdsResources, "the connection ended holding a key claim, an upload slot or memory")
    return 0
}

/// What decodes must encode to bytes that decode to the same frame; only ProtocolError may come out of the decoder.
func checkRoundTrips(_ bytes: ByteBuffer, reader: inout FrameReader, limit: Int) {
    reader.append(bytes)
    while true {
        reader.maxFrameSize = limit
        let frame: Frame?
        do {
            frame = try reader.next()
        } catch is ProtocolError {
            reader = FrameReader()
            return
        } catch {
            fatalError("the decoder threw something other than a ProtocolError: \(error)")
        }
        guard let frame else { return }
        var again = FrameReader()
        again.maxFrameSize = limit
        again.append(FrameEncoder.encodeToBuffer(frame))
        let decoded: Frame?
        do {
            decoded = try again.next()
        } catch {
            fatalError("\(frame) encodes to bytes that do not decode: \(error)")
        }
        precondition(decoded == frame, "\(frame) came back as \(String(describing: decoded))")
    }
}
