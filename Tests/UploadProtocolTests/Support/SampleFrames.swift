import NIOCore
import UploadProtocol

/// One or more frames of every type and flag variant.
enum SampleFrames {
    static let digest = SHA1Digest(hex: "a9993e364706816aba3e25717850c26c9cd0d89d")!

    static func buffer(_ bytes: [UInt8]) -> ByteBuffer {
        ByteBuffer(bytes: bytes)
    }

    static let all: [Frame] = [
        .hello(
            Frame.Hello(
                maxFrameSize: 1_114_112, features: .deflate, credential: Array("secret-token".utf8), agentName: "cam-7"
            )
        ),
        .hello(Frame.Hello(minVersion: 1, maxVersion: 3, maxFrameSize: 16_384, features: [], credential: [], agentName: "")),
        .welcome(
            Frame.Welcome(
                maxFrameSize: 1_114_112, features: .deflate, maxStreams: 64, connectionWindow: 16 << 20,
                streamWindow: 4 << 20, maxKeyLength: 1024, idleTimeoutMillis: 120_000, account: "cam-7"
            )
        ),
        .open(Frame.Open(streamID: 1, key: "photos/2026/IMG_0001.jpg")),
        .open(
            Frame.Open(
                streamID: 3, key: "a/b", size: 12345, sha1: digest, overwrite: true, fingerprint: [1, 2, 3],
                resumeToken: Array(repeating: 0xAB, count: 16)
            )
        ),
        .open(Frame.Open(streamID: 5, key: "é/ü", size: 0)),
        .offset(Frame.Offset(streamID: 1, disposition: .start, offset: 0, resumeToken: [9, 9])),
        .offset(Frame.Offset(streamID: 1, disposition: .resume, offset: 1 << 40, resumeToken: [1])),
        .offset(Frame.Offset(streamID: 7, disposition: .stored, offset: 77)),
        .chunk(Frame.Chunk(streamID: 1, offset: 0, crc32: 0xCBF4_3926, data: buffer(Array("123456789".utf8)))),
        .chunk(Frame.Chunk(streamID: 9, offset: 1 << 33, crc32: 1, rawLength: 4096, data: buffer([0x78, 0x9C, 1, 2]))),
        .ack(Frame.Ack(streamID: 1, offset: 9)),
        .credit(Frame.Credit(streamID: 1, increment: 65_536)),
        .credit(Frame.Credit(streamID: .connection, increment: UInt32(Int32.max))),
        .hash(Frame.Hash(streamID: 1, size: 9, sha1: digest)),
        .hash(Frame.Hash(streamID: 2, size: 0, sha1: .empty)),
        .result(Frame.Result(streamID: 1, status: .stored, size: 9, sha1: digest, key: "a/b")),
        .result(Frame.Result(streamID: 1, status: .unchanged, size: 0, sha1: .empty, key: "x")),
        .error(Frame.Error(streamID: 1, code: .crcMismatch, message: "chunk at 0: crc32 mismatch")),
        .error(Frame.Error(streamID: .connection, code: .unauthenticated, message: "unknown token")),
        .error(Frame.Error(streamID: 3, code: WireErrorCode(rawValue: 0x4242), message: "")),
        .cancel(Frame.Cancel(streamID: 1, message: "user pressed stop")),
        .ping(Frame.Ping(data: 0x0102_0304_0506_0708)),
        .pong(Frame.Pong(data: .max)),
        .goAway(Frame.GoAway(lastStreamID: 41, code: .noError, message: "relay shutting down")),
        .plan(Frame.Plan(request: 1, overwrite: false, entries: [.init(key: "cam-7/a.jpg", size: 3_000_000), .init(key: "b", size: 0)])),
        .plan(Frame.Plan(request: .max, overwrite: true, entries: [])),
        .room(Frame.Room(request: 1, quota: 10 << 30, used: 9 << 30, needs: [3_000_000, 0])),
        .room(Frame.Room(request: 2, quota: nil, used: 0, needs: [])),
        .extension(Frame.Extension(type: FrameType(rawValue: 0x80), flags: 0xFF, streamID: 3, data: buffer([1, 2, 3]))),
    ]
}
