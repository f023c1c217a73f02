// libFuzzer entry point: arbitrary bytes from an agent, cut into reads of a size the input picks,
// go through the relay's FrameReader and RelayConnectionStateMachine, with the handler's answers
// played back (accept the HELLO, start every upload at 0, consume every chunk, store every blob).
//
// What counts as a bug: any crash or trap (a relay crash drops every upload on it), a decoder
// error that is not a ProtocolError, or a decoded frame that does not survive encode + decode.

import NIOCore
import UploadProtocol

func fuzzRelayInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let piece = Int(data[0]) * 61 + 1
    var session = RelaySession()
    var offset = 1
    while offset < size && !session.closed {
        let n = min(piece, size - offset)
        session.read(ByteBuffer(bytes: UnsafeBufferPointer(start: data + offset, count: n)))
        offset += n
    }
    return 0
}

struct RelaySession {
    var reader = FrameReader()
    var machine = RelayConnectionStateMachine()
    var closed = false
    /// A fixed clock: the PING flood limit depends on time, and a run must repeat exactly.
    let now = NIODeadline.uptimeNanoseconds(1_000_000_000)

    mutating func read(_ bytes: ByteBuffer) {
        self.reader.append(bytes)
        while !self.closed {
            let frame: Frame?
            self.reader.maxFrameSize = self.machine.inboundFrameLimit
            do {
                frame = try self.reader.next()
            } catch let error as ProtocolError {
                _ = self.machine.decodingFailed(error)
                self.closed = true
                return
            } catch {
                fatalError("the decoder threw something other than a ProtocolError: \(error)")
            }
            guard let frame else { return }
            Self.checkRoundTrip(frame, maxFrameSize: self.reader.maxFrameSize)
            self.run(self.machine.receive(frame, now: self.now))
        }
    }

    /// What decodes must encode to bytes that decode to the same frame.
    static func checkRoundTrip(_ frame: Frame, maxFrameSize: Int) {
        var again = FrameReader()
        again.maxFrameSize = maxFrameSize
        again.append(FrameEncoder.encodeToBuffer(frame))
        let decoded: Frame?
        do {
            decoded = try again.next()
        } catch {
            fatalError("\(frame) encodes to bytes that do not decode: \(error)")
        }
        precondition(decoded == frame, "\(frame) came back as \(String(describing: decoded))")
    }

    /// The relay handler's part, without storage: every answer is the happy one.
    mutating func run(_ action: RelayAction) {
        switch action {
        case .authenticate:
            _ = self.machine.acceptHello(account: "fuzz")
        case .openUpload(let open, _):
            _ = self.machine.sendOffset(Frame.Offset(streamID: open.streamID, disposition: .start, offset: 0))
        case .write(let chunk):
            _ = self.machine.storageConsumed(chunk.streamID, bytes: chunk.payloadLength)
            _ = self.machine.sendAck(chunk.streamID, offset: chunk.offset + UInt64(chunk.payloadLength))
        case .finish(let hash):
            _ = self.machine.sendResult(
                Frame.Result(streamID: hash.streamID, status: .stored, size: hash.size, sha1: hash.sha1, key: "fuzz")
            )
        case .closeConnection, .peerClosed:
            self.closed = true
        case .none, .abortUpload, .send, .resetStream, .peerGoingAway:
            break
        }
    }
}
