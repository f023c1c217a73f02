import NIOCore
import Testing
@testable import UploadProtocol
import UploadTestSupport

@Suite("Frame codec")
struct FrameCodecTests {
    static func decodeAll(_ bytes: inout ByteBuffer, maxFrameSize: Int = 1_114_112) throws -> [Frame] {
        var decoder = FrameDecoder(maxFrameSize: maxFrameSize)
        var frames: [Frame] = []
        while let frame = try decoder.decodeFrame(from: &bytes) {
            frames.append(frame)
        }
        return frames
    }

    @Test("every sample frame round-trips", arguments: SampleFrames.all)
    func roundTrip(frame: Frame) async throws {
        var bytes = frame.encoded()
        let length = bytes.getInteger(at: 0, as: UInt32.self)!
        #expect(Int(length) == bytes.readableBytes)
        #expect(bytes.getInteger(at: 4, as: UInt8.self) == frame.type.rawValue)
        let decoded = try Self.decodeAll(&bytes)
        #expect(decoded == [frame])
        #expect(bytes.readableBytes == 0)
    }

    @Test("a message past 1024 bytes is cut at a character boundary, so ERROR, CANCEL and GOAWAY always decode (SPEC §12.1)")
    func longMessagesFit() async throws {
        let long = String(repeating: "é€a", count: 400) + " the end"  // 2,408 bytes of 1-, 2- and 3-byte characters
        let frames: [Frame] = [
            .error(Frame.Error(streamID: StreamID(rawValue: 1), code: .invalidKey, message: long)),
            .cancel(Frame.Cancel(streamID: StreamID(rawValue: 1), message: long)),
            .goAway(Frame.GoAway(lastStreamID: StreamID(rawValue: 1), code: .noError, message: long)),
        ]
        for frame in frames {
            var bytes = frame.encoded()
            #expect(try Self.decodeAll(&bytes) == [frame])
        }
        let cut = Frame.fitting(long)
        #expect(cut.utf8.count <= Frame.maxMessageBytes && cut.utf8.count > Frame.maxMessageBytes - 4)
        #expect(cut.hasSuffix("…") && long.hasPrefix(String(cut.dropLast())))
        #expect(Frame.fitting("short") == "short")
        let exact = String(repeating: "x", count: Frame.maxMessageBytes)
        #expect(Frame.fitting(exact) == exact)

        // HELLO's agent name likewise, at 255 bytes: a long host name never breaks the handshake.
        let hello = Frame.hello(Frame.Hello(maxFrameSize: 1 << 20, features: [], credential: Array("t".utf8), agentName: long))
        var bytes = hello.encoded()
        #expect(try Self.decodeAll(&bytes) == [hello])
        guard case .hello(let sent) = hello else { return }
        #expect(sent.agentName.utf8.count <= Frame.maxNameBytes && sent.agentName.hasSuffix("…"))
    }

    @Test("the chunk encoder returns the payload itself, uncopied")
    func chunkPayloadIsNotCopied() async {
        let data = ByteBuffer(repeating: 7, count: 1 << 20)
        let chunk = Frame.Chunk(streamID: 1, offset: 0, crc32: 0, data: data)
        var header = ByteBuffer()
        let payload = FrameEncoder.encode(.chunk(chunk), into: &header)
        #expect(header.readableBytes == FrameHeader.size + Frame.Chunk.fieldsSize(deflated: false))
        #expect(header.getInteger(at: 0, as: UInt32.self) == UInt32(header.readableBytes + data.readableBytes))
        let same = payload!.withUnsafeReadableBytes { p in data.withUnsafeReadableBytes { $0.baseAddress == p.baseAddress } }
        #expect(same)
    }

    @Test("the decoder slices chunk data out of the input without copying")
    func chunkDecodeIsSlice() async throws {
        var bytes = Frame.chunk(Frame.Chunk(streamID: 1, offset: 0, crc32: 0, data: ByteBuffer(repeating: 1, count: 4096))).encoded()
        let base = bytes.withUnsafeReadableBytes { $0.baseAddress! }
        let frames = try Self.decodeAll(&bytes)
        guard case .chunk(let chunk) = frames.first else {
            Issue.record("expected a chunk")
            return
        }
        let dataBase = chunk.data.withUnsafeReadableBytes { $0.baseAddress! }
        #expect(dataBase == base + FrameHeader.size + 12)
    }

    @Test("byte-at-a-time drip feeding yields each frame exactly when its last byte arrives")
    func dripFeed() async throws {
        var all = ByteBuffer()
        var ends: [Int] = []
        for frame in SampleFrames.all {
            var one = frame.encoded()
            all.writeBuffer(&one)
            ends.append(all.writerIndex)
        }
        var decoder = FrameDecoder(maxFrameSize: 1_114_112)
        var pending = ByteBuffer()
        var decoded: [Frame] = []
        var fed = 0
        for byte in all.readableBytesView {
            pending.writeInteger(byte)
            fed += 1
            while let frame = try decoder.decodeFrame(from: &pending) {
                decoded.append(frame)
                #expect(ends[decoded.count - 1] == fed)
            }
        }
        #expect(decoded == SampleFrames.all)
    }

    @Test(
        "FrameReader: frames of 1 MiB and a few bytes cut into random pieces come out whole and in order; a payload handed out keeps its bytes while more arrive",
        arguments: [31, 32, 33] as [UInt64])
    func readerRandomPieces(seed: UInt64) async throws {
        var rng = SeededGenerator(seed: seed)
        var expected: [Frame] = []
        var stream = ByteBuffer()
        for index in 0..<40 {
            let frame: Frame
            switch rng.next() % 3 {
            case 0:
                let size = Int(rng.next() % UInt64(1 << 20)) + 1
                var data = ByteBuffer()
                data.writeBytes((0..<size).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
                frame = .chunk(Frame.Chunk(streamID: 1, offset: UInt64(index), crc32: UInt32(index), data: data))
            case 1:
                frame = .ack(Frame.Ack(streamID: 3, offset: UInt64(index)))
            default:
                frame = SampleFrames.all[index % SampleFrames.all.count]
            }
            expected.append(frame)
            var encoded = frame.encoded()
            stream.writeBuffer(&encoded)
        }
        var reader = FrameReader(decoder: FrameDecoder(maxFrameSize: (1 << 20) + 64))
        var decoded: [Frame] = []
        while stream.readableBytes > 0 {
            // Pieces from 1 byte to 300 KiB, as TLS records and socket reads come.
            let length = min(stream.readableBytes, Int(rng.next() % 300_000) + 1)
            reader.append(stream.readSlice(length: length)!)
            while let frame = try reader.next() { decoded.append(frame) }
        }
        #expect(!reader.hasPartialFrame)
        #expect(decoded == expected, "seed \(seed)")
    }

    @Test(
        "FrameReader: a CHUNK of 1 MiB in pieces keeps its data in a buffer of 1 MiB (not 2: buffers come in powers of two), deflated or not; what follows it comes after it"
    )
    func readerGathersChunkData() async throws {
        var rng = SeededGenerator(seed: 7)
        for deflated in [false, true] {
            var data = ByteBuffer()
            data.writeBytes((0..<(1 << 20)).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
            let chunk = Frame.chunk(Frame.Chunk(streamID: 5, offset: 1 << 20, crc32: 77, rawLength: deflated ? (1 << 20) + 32 : nil, data: data))
            let ack = Frame.ack(Frame.Ack(streamID: 5, offset: 9))
            var stream = chunk.encoded()
            var tail = ack.encoded()
            stream.writeBuffer(&tail)
            var reader = FrameReader(decoder: FrameDecoder(maxFrameSize: (1 << 20) + 64))
            var decoded: [Frame] = []
            // 64 KiB reads, and one that ends the chunk and starts the ACK.
            while stream.readableBytes > 0 {
                reader.append(stream.readSlice(length: min(stream.readableBytes, 65_536 + 7))!)
                while let frame = try reader.next() { decoded.append(frame) }
            }
            #expect(decoded == [chunk, ack], "deflated \(deflated)")
            guard case .chunk(let got) = decoded.first else { continue }
            #expect(got.data.capacity == 1 << 20, "deflated \(deflated): a buffer of \(got.data.capacity) bytes")
            #expect(!reader.hasPartialFrame)
        }
    }

    @Test(
        "FrameReader: once no whole frame is left in a read, nothing handed out or kept shares the read's buffer (TLS fills it again: shared, it is copied whole), whatever frame is left in pieces",
        arguments: [0, 3, 10, 26, 30, 5_000]
    )
    func readerLetsGoOfTheRead(cut: Int) async throws {
        var rng = SeededGenerator(seed: UInt64(cut) + 1)
        func chunk(_ offset: UInt64, _ size: Int) -> Frame {
            var data = ByteBuffer()
            data.writeBytes((0..<size).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
            return .chunk(Frame.Chunk(streamID: 7, offset: offset, crc32: UInt32(offset), data: data))
        }
        // Two thumbnails' CHUNKs and an ACK whole, then the first `cut` bytes of a third CHUNK (none, its length only,
        // part of its fields, its fields, some of its data).
        let whole = [chunk(0, 16_384), .ack(Frame.Ack(streamID: 7, offset: 16_384)), chunk(16_384, 16_384)]
        let last = chunk(32_768, 16_384)
        var read = ByteBuffer()
        for frame in whole {
            var encoded = frame.encoded()
            read.writeBuffer(&encoded)
        }
        var rest = last.encoded()
        var head = rest.readSlice(length: cut)!
        read.writeBuffer(&head)
        let base = read.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
        var reader = FrameReader(decoder: FrameDecoder(maxFrameSize: 1 << 20))
        reader.append(read)
        var decoded: [Frame] = []
        while let frame = try reader.next() { decoded.append(frame) }
        #expect(decoded == whole, "cut \(cut)")
        #expect(reader.hasPartialFrame == (cut > 0), "cut \(cut)")
        // Written into in place, not copied first: no one else holds it.
        let after = read.withUnsafeMutableReadableBytes { UInt(bitPattern: $0.baseAddress) }
        #expect(after == base, "cut \(cut): the read's buffer is still shared")
        // The rest of the last frame comes out whole.
        reader.append(rest)
        #expect(try reader.next() == last, "cut \(cut)")
        #expect(try reader.next() == nil && !reader.hasPartialFrame, "cut \(cut)")
    }

    @Test(
        "FrameReader: a CHUNK's data is held in a buffer of exactly its size, not the next power of two, whole in one read or in pieces",
        arguments: [0, 10, 26, 40_000]
    )
    func chunkDataExactSize(cut: Int) async throws {
        // 327,680 bytes: a connection's share of 32 MiB among 100 agents; NIO's buffers would take 524,288.
        let size = 327_680
        var data = ByteBuffer()
        data.writeBytes((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        let frame = Frame.chunk(Frame.Chunk(streamID: 5, offset: 0, crc32: 9, data: data))
        var encoded = frame.encoded()
        var reader = FrameReader(decoder: FrameDecoder(maxFrameSize: 1 << 20))
        if cut > 0 { reader.append(encoded.readSlice(length: cut)!) }
        #expect(try reader.next() == nil || cut == 0)
        reader.append(encoded)
        let decoded = try #require(try reader.next())
        #expect(decoded == frame, "cut \(cut)")
        guard case .chunk(let chunk) = decoded else { return }
        #expect(chunk.data.capacity == size, "cut \(cut): a buffer of \(chunk.data.capacity) bytes for \(size)")
    }

    @Test("FrameReader: a CHUNK that is malformed is refused in pieces as whole: stream 0, reserved flags, too large once raised past")
    func readerRefusesMalformedChunkInPieces() async throws {
        var data = ByteBuffer()
        data.writeBytes([UInt8](repeating: 7, count: 200_000))
        let good = Frame.chunk(Frame.Chunk(streamID: 3, offset: 0, crc32: 1, data: data)).encoded()
        var cases: [(String, ByteBuffer)] = []
        var zero = good
        zero.setInteger(UInt32(0), at: zero.readerIndex + 6)
        cases.append(("stream 0", zero))
        var flags = good
        flags.setInteger(UInt8(0x80), at: flags.readerIndex + 5)
        cases.append(("reserved flags", flags))
        for (name, encoded) in cases {
            var whole = FrameDecoder(maxFrameSize: 1 << 20)
            var all = encoded
            let wholeError = #expect(throws: ProtocolError.self) { _ = try whole.decodeFrame(from: &all) }
            var reader = FrameReader(decoder: FrameDecoder(maxFrameSize: 1 << 20))
            var pieces = encoded
            var pieceError: (any Error)? = nil
            while pieces.readableBytes > 0, pieceError == nil {
                reader.append(pieces.readSlice(length: min(pieces.readableBytes, 30_000))!)
                do {
                    while try reader.next() != nil {}
                } catch {
                    pieceError = error
                }
            }
            #expect(pieceError.map { "\($0)" } == wholeError.map { "\($0)" }, "\(name)")
        }
    }

    @Test("FrameReader: a length above the limit is refused as soon as its four bytes are in, however the bytes come")
    func readerRefusesOversized() async throws {
        var reader = FrameReader(decoder: FrameDecoder(maxFrameSize: 1 << 16))
        var header = ByteBuffer()
        header.writeInteger(UInt32(1 << 30))
        reader.append(header.readSlice(length: 2)!)
        #expect(try reader.next() == nil)
        reader.append(header.readSlice(length: 2)!)
        #expect(throws: ProtocolError.self) { try reader.next() }
    }

    @Test("many frames in one buffer")
    func manyFramesInOneBuffer() async throws {
        var all = ByteBuffer()
        var expected: [Frame] = []
        for i in 0..<1000 {
            let frame = SampleFrames.all[i % SampleFrames.all.count]
            var one = frame.encoded()
            all.writeBuffer(&one)
            expected.append(frame)
        }
        #expect(try Self.decodeAll(&all) == expected)
    }

    @Test("randomized frames round-trip in random pieces")
    func randomized() async throws {
        var rng = SeededGenerator(seed: 42)
        var expected: [Frame] = []
        var all = ByteBuffer()
        for _ in 0..<2000 {
            let frame = RandomFrames.make(using: &rng)
            expected.append(frame)
            var one = frame.encoded()
            all.writeBuffer(&one)
        }
        var decoder = FrameDecoder(maxFrameSize: ProtocolLimits.largestMaxFrameSize)
        var pending = ByteBuffer()
        var decoded: [Frame] = []
        while all.readableBytes > 0 {
            var piece = all.readSlice(length: min(all.readableBytes, Int.random(in: 1...9000, using: &rng)))!
            pending.writeBuffer(&piece)
            while let frame = try decoder.decodeFrame(from: &pending) {
                decoded.append(frame)
            }
        }
        #expect(decoded == expected)
    }

    @Test("a length above the maximum is refused from its four bytes alone")
    func lengthCheckedAtHeader() async {
        var decoder = FrameDecoder(maxFrameSize: 65_536)
        var bytes = ByteBuffer(bytes: [0x00, 0x01, 0x00, 0x01])
        #expect(throws: ProtocolError.connection(.frameSizeError, "frame length 65537 is above the maximum frame size 65536")) {
            try decoder.decodeFrame(from: &bytes)
        }
        var short = ByteBuffer(bytes: [0, 0, 0, 9])
        #expect((try? decoder.decodeFrame(from: &short)) == nil)
        #expect(throws: ProtocolError.self) { try decoder.decodeFrame(from: &short) }
    }

    @Test("need-more-bytes consumes nothing")
    func needMoreConsumesNothing() async throws {
        var decoder = FrameDecoder()
        let whole = SampleFrames.all[0].encoded()
        var partial = whole.getSlice(at: 0, length: whole.readableBytes - 1)!
        #expect(try decoder.decodeFrame(from: &partial) == nil)
        #expect(partial.readerIndex == 0)
    }

    @Test("extension frames skip; unknown core types are connection errors")
    func unknownTypes() async throws {
        var ext = ByteBuffer(bytes: [0, 0, 0, 12, 0xC3, 0xFF, 0, 0, 0, 0, 1, 2])
        #expect(try Self.decodeAll(&ext).count == 1)
        for type: UInt8 in [0x00, 0x11, 0x7F] {
            var bytes = ByteBuffer(bytes: [0, 0, 0, 10, type, 0, 0, 0, 0, 0])
            #expect(throws: ProtocolError.self) { try Self.decodeAll(&bytes) }
        }
    }

    @Test("payload rules: trailing bytes, short payload, reserved flags, stream placement")
    func payloadRules() async throws {
        var ack = Frame.ack(Frame.Ack(streamID: 1, offset: 5)).encoded()
        ack.writeInteger(UInt8(0))
        ack.setInteger(UInt32(ack.readableBytes), at: 0)
        #expect(throws: ProtocolError.self) { try Self.decodeAll(&ack) }

        var short = ByteBuffer(bytes: [0, 0, 0, 13, 0x06, 0, 0, 0, 0, 1, 0, 0, 0])
        #expect(throws: ProtocolError.self) { try Self.decodeAll(&short) }

        var flagged = Frame.ack(Frame.Ack(streamID: 1, offset: 5)).encoded()
        flagged.setInteger(UInt8(1), at: 5)
        #expect(throws: ProtocolError.self) { try Self.decodeAll(&flagged) }

        var ackOnZero = Frame.ack(Frame.Ack(streamID: 1, offset: 5)).encoded()
        ackOnZero.setInteger(UInt32(0), at: 6)
        #expect(throws: ProtocolError.self) { try Self.decodeAll(&ackOnZero) }

        var pingOnStream = Frame.ping(Frame.Ping(data: 1)).encoded()
        pingOnStream.setInteger(UInt32(1), at: 6)
        #expect(throws: ProtocolError.self) { try Self.decodeAll(&pingOnStream) }

        var topBit = Frame.ack(Frame.Ack(streamID: 1, offset: 5)).encoded()
        topBit.setInteger(UInt32(0x8000_0001), at: 6)
        #expect(throws: ProtocolError.self) { try Self.decodeAll(&topBit) }
    }

    @Test("every error code has a name that maps back")
    func errorCodeNames() async {
        for code in WireErrorCode.allDefined {
            #expect(WireErrorCode(name: code.name) == code)
        }
        #expect(WireErrorCode(rawValue: 0x2A).name == "UNKNOWN_0x002a")
    }
}
