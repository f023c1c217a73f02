import NIOCore
import UploadProtocol
import UploadTestSupport

/// Random but valid frames, for round trips.
enum RandomFrames {
    static func bytes(_ count: Int, using rng: inout SeededGenerator) -> [UInt8] {
        (0..<count).map { _ in UInt8.random(in: 0...255, using: &rng) }
    }

    static func text(_ count: Int, using rng: inout SeededGenerator) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789-_é€😀")
        return String((0..<count).map { _ in alphabet.randomElement(using: &rng)! })
    }

    static func stream(using rng: inout SeededGenerator) -> StreamID {
        StreamID(UInt32.random(in: 1...UInt32(Int32.max), using: &rng))
    }

    static func size(using rng: inout SeededGenerator) -> UInt64 {
        UInt64.random(in: 0...(1 << 40), using: &rng)
    }

    static func make(using rng: inout SeededGenerator) -> Frame {
        let digest = SHA1Digest(bytes: bytes(20, using: &rng))!
        switch Int.random(in: 0..<16, using: &rng) {
        case 0:
            return .hello(
                Frame.Hello(
                    minVersion: 1, maxVersion: UInt16.random(in: 1...9, using: &rng),
                    maxFrameSize: UInt32.random(in: 16_384...16_777_216, using: &rng),
                    features: Frame.Features(rawValue: UInt32.random(in: 0...UInt32.max, using: &rng)),
                    credential: bytes(Int.random(in: 0...1024, using: &rng), using: &rng),
                    agentName: text(Int.random(in: 0...40, using: &rng), using: &rng)
                )
            )
        case 1:
            return .welcome(
                Frame.Welcome(
                    maxFrameSize: UInt32.random(in: 16_384...16_777_216, using: &rng), features: .deflate,
                    maxStreams: UInt32.random(in: 1...1000, using: &rng),
                    connectionWindow: UInt32.random(in: 0...UInt32(Int32.max), using: &rng),
                    streamWindow: UInt32.random(in: 0...UInt32(Int32.max), using: &rng),
                    maxKeyLength: UInt16.random(in: 1...4096, using: &rng),
                    idleTimeoutMillis: UInt32.random(in: 0...UInt32.max, using: &rng),
                    account: text(Int.random(in: 0...30, using: &rng), using: &rng)
                )
            )
        case 2:
            // A third are probes (SPEC §7.1): a known size above the probe length, no whole SHA-1.
            let probe = Int.random(in: 0..<3, using: &rng) == 0
            let sizeKnown = probe || Bool.random(using: &rng)
            let blobSize = probe ? UInt64.random(in: (Frame.Open.probeLength + 1)...(1 << 40), using: &rng) : size(using: &rng)
            return .open(
                Frame.Open(
                    streamID: stream(using: &rng), rawKey: bytes(Int.random(in: 0...300, using: &rng), using: &rng),
                    size: sizeKnown ? blobSize : nil, sha1: !probe && Bool.random(using: &rng) ? digest : nil,
                    overwrite: Bool.random(using: &rng), fingerprint: bytes(Int.random(in: 0...64, using: &rng), using: &rng),
                    resumeToken: bytes(Int.random(in: 0...64, using: &rng), using: &rng), probe: probe ? digest : nil
                )
            )
        case 3:
            let disposition = [Frame.Offset.Disposition.start, .resume, .stored, .confirm].randomElement(using: &rng) ?? .start
            let offset: UInt64 = disposition == .start || disposition == .confirm ? 0 : UInt64.random(in: 1...(1 << 40), using: &rng)
            return .offset(
                Frame.Offset(
                    streamID: stream(using: &rng), disposition: disposition, offset: offset,
                    resumeToken: disposition == .stored || disposition == .confirm
                        ? [] : bytes(Int.random(in: 0...64, using: &rng), using: &rng)
                )
            )
        case 4:
            let data = ByteBuffer(bytes: bytes(Int.random(in: 1...4000, using: &rng), using: &rng))
            let deflated = Bool.random(using: &rng)
            return .chunk(
                Frame.Chunk(
                    streamID: stream(using: &rng), offset: size(using: &rng), crc32: UInt32.random(in: 0...UInt32.max, using: &rng),
                    rawLength: deflated ? UInt32.random(in: 1...1_000_000, using: &rng) : nil, data: data
                )
            )
        case 5:
            return .ack(Frame.Ack(streamID: stream(using: &rng), offset: size(using: &rng)))
        case 6:
            return .credit(
                Frame.Credit(
                    streamID: Bool.random(using: &rng) ? .connection : stream(using: &rng),
                    increment: UInt32.random(in: 1...UInt32(Int32.max), using: &rng)
                )
            )
        case 7:
            return .hash(Frame.Hash(streamID: stream(using: &rng), size: size(using: &rng), sha1: digest))
        case 8:
            return .result(
                Frame.Result(
                    streamID: stream(using: &rng), status: Bool.random(using: &rng) ? .stored : .unchanged,
                    size: size(using: &rng), sha1: digest, key: text(Int.random(in: 1...100, using: &rng), using: &rng)
                )
            )
        case 9:
            return .error(
                Frame.Error(
                    streamID: Bool.random(using: &rng) ? .connection : stream(using: &rng),
                    code: WireErrorCode(rawValue: UInt16.random(in: 0...0x30, using: &rng)),
                    message: text(Int.random(in: 0...200, using: &rng), using: &rng)
                )
            )
        case 10:
            return .cancel(
                Frame.Cancel(streamID: stream(using: &rng), message: text(Int.random(in: 0...100, using: &rng), using: &rng))
            )
        case 11:
            return .ping(Frame.Ping(data: UInt64.random(in: 0...UInt64.max, using: &rng)))
        case 12:
            return .pong(Frame.Pong(data: UInt64.random(in: 0...UInt64.max, using: &rng)))
        case 13:
            let entries = (0..<Int.random(in: 0...20, using: &rng)).map { _ in
                Frame.Plan.Entry(key: text(Int.random(in: 1...60, using: &rng), using: &rng), size: UInt64.random(in: 0...(1 << 62), using: &rng))
            }
            return .plan(Frame.Plan(request: UInt32.random(in: 0...UInt32.max, using: &rng), overwrite: Bool.random(using: &rng), entries: entries))
        case 14:
            let needs = (0..<Int.random(in: 0...20, using: &rng)).map { _ in UInt64.random(in: 0...(1 << 62), using: &rng) }
            return .room(
                Frame.Room(
                    request: UInt32.random(in: 0...UInt32.max, using: &rng),
                    quota: Bool.random(using: &rng) ? nil : UInt64.random(in: 0...(1 << 62), using: &rng),
                    used: UInt64.random(in: 0...(1 << 62), using: &rng), needs: needs
                )
            )
        default:
            return .goAway(
                Frame.GoAway(
                    lastStreamID: StreamID(UInt32.random(in: 0...UInt32(Int32.max), using: &rng)), code: .noError,
                    message: text(Int.random(in: 0...100, using: &rng), using: &rng)
                )
            )
        }
    }
}
