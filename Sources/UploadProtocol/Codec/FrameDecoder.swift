import NIOCore

/// Cuts a byte stream into frames (SPEC §1, §3).
///
/// `decodeFrame(from:)` returns nil when more bytes are needed and consumes nothing then; it
/// throws a connection-scoped ``ProtocolError`` when the input is malformed. A frame length
/// below the header size or above ``maxFrameSize`` is refused as soon as its four length
/// bytes are in, so a peer can never make the decoder buffer more than one maximum frame.
/// CHUNK and extension payloads are slices of the input: never copied.
public struct FrameDecoder: Sendable {
    /// The largest frame accepted, header included. Starts at ``ProtocolLimits/initialMaxFrameSize``;
    /// raise it to the announced limit once HELLO or WELCOME has been sent (SPEC §1.2).
    public var maxFrameSize: Int
    /// Field limits (SPEC §12).
    public var limits: ProtocolLimits

    public init(maxFrameSize: Int = ProtocolLimits.initialMaxFrameSize, limits: ProtocolLimits = .init()) {
        self.maxFrameSize = maxFrameSize
        self.limits = limits
    }

    /// The next whole frame in `buffer`, or nil when it is not all there yet.
    public mutating func decodeFrame(from buffer: inout ByteBuffer) throws -> Frame? {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) else {
            return nil
        }
        // SPEC §1.1: check the length before waiting for the rest.
        guard length >= FrameHeader.size else {
            throw ProtocolError.connection(
                .frameSizeError, "frame length \(length) is below the header size \(FrameHeader.size)"
            )
        }
        guard length <= self.maxFrameSize else {
            throw ProtocolError.connection(
                .frameSizeError, "frame length \(length) is above the maximum frame size \(self.maxFrameSize)"
            )
        }
        guard buffer.readableBytes >= Int(length) else {
            return nil
        }
        let header = try Self.parseHeader(buffer, length: Int(length))
        var payload = buffer.getSlice(at: buffer.readerIndex + FrameHeader.size, length: Int(length) - FrameHeader.size)!
        let frame = try self.parsePayload(header, &payload)
        guard payload.readableBytes == 0 else {
            throw ProtocolError.connection(
                .frameSizeError, "\(header.type.name) payload has \(payload.readableBytes) bytes after its last field"
            )
        }
        buffer.moveReaderIndex(forwardBy: Int(length))
        return frame
    }

    /// A CHUNK that ``FrameReader`` gathered in two parts: `prefix`, the frame's header and the CHUNK's fields; `data`,
    /// the rest of the frame, its data. The same checks and the same frame as ``decodeFrame(from:)`` of the frame whole.
    public mutating func decodeGatheredChunk(prefix: ByteBuffer, data: ByteBuffer) throws -> Frame {
        let length = prefix.readableBytes + data.readableBytes
        guard length <= self.maxFrameSize else {
            throw ProtocolError.connection(.frameSizeError, "frame length \(length) is above the maximum frame size \(self.maxFrameSize)")
        }
        let header = try Self.parseHeader(prefix, length: length)
        guard header.type == .chunk, prefix.readableBytes > FrameHeader.size else {
            throw ProtocolError.connection(.internalError, "a frame gathered as a CHUNK is a \(header.type.name)")
        }
        var fields = prefix.getSlice(at: prefix.readerIndex + FrameHeader.size, length: prefix.readableBytes - FrameHeader.size)!
        let chunk = try self.parseChunk(&fields, stream: header.streamID, flags: header.flags, data: data)
        try Self.expectEnd(fields, .chunk)
        return .chunk(chunk)
    }

    /// SPEC §1.3–§1.5: type, flags and stream id, checked before the payload is read.
    static func parseHeader(_ buffer: ByteBuffer, length: Int) throws -> FrameHeader {
        let base = buffer.readerIndex
        let type = FrameType(rawValue: buffer.getInteger(at: base + 4, as: UInt8.self)!)
        let flags = buffer.getInteger(at: base + 5, as: UInt8.self)!
        let rawStream = buffer.getInteger(at: base + 6, as: UInt32.self)!
        guard rawStream <= StreamID.maxID.rawValue else {
            throw ProtocolError.connection(.protocolError, "stream id 0x\(String(rawStream, radix: 16)) has the reserved top bit set")
        }
        let stream = StreamID(rawValue: rawStream)
        let header = FrameHeader(length: length, type: type, flags: flags, streamID: stream)
        if type.isExtension {
            return header
        }
        let allowedFlags: UInt8
        let streamRule: StreamRule
        switch type {
        case .hello, .welcome, .ping, .pong, .goAway, .room:
            allowedFlags = 0
            streamRule = .connectionOnly
        case .plan:
            allowedFlags = Frame.Plan.overwriteFlag
            streamRule = .connectionOnly
        case .open:
            allowedFlags = Frame.Open.allFlags
            streamRule = .streamOnly
        case .chunk:
            allowedFlags = Frame.Chunk.deflatedFlag
            streamRule = .streamOnly
        case .offset, .ack, .hash, .result, .cancel:
            allowedFlags = 0
            streamRule = .streamOnly
        case .error, .credit:
            allowedFlags = 0
            streamRule = .either
        default:
            throw ProtocolError.connection(.protocolError, "unknown frame type 0x\(String(type.rawValue, radix: 16))")
        }
        guard flags & ~allowedFlags == 0 else {
            throw ProtocolError.connection(
                .protocolError, "\(type.name) has reserved flag bits 0x\(String(flags & ~allowedFlags, radix: 16)) set"
            )
        }
        switch streamRule {
        case .connectionOnly where !stream.isConnection:
            throw ProtocolError.connection(.protocolError, "\(type.name) must travel on stream 0, not stream \(stream)")
        case .streamOnly where stream.isConnection:
            throw ProtocolError.connection(.protocolError, "\(type.name) must travel on a stream, not on stream 0")
        default:
            return header
        }
    }

    enum StreamRule {
        case connectionOnly, streamOnly, either
    }

    static func expectEnd(_ payload: ByteBuffer, _ type: FrameType) throws {
        guard payload.readableBytes == 0 else {
            throw ProtocolError.connection(
                .frameSizeError, "\(type.name) payload has \(payload.readableBytes) bytes after its last field"
            )
        }
    }

    /// Reads every field (FRAME_SIZE_ERROR when the layout is off), then judges the values (SPEC §1.9).
    func parsePayload(_ header: FrameHeader, _ payload: inout ByteBuffer) throws -> Frame {
        let type = header.type
        let stream = header.streamID
        switch type {
        case .hello:
            return .hello(try self.parseHello(&payload))
        case .welcome:
            return .welcome(try self.parseWelcome(&payload))
        case .open:
            return .open(try self.parseOpen(&payload, stream: stream, flags: header.flags))
        case .offset:
            return .offset(try self.parseOffset(&payload, stream: stream))
        case .chunk:
            return .chunk(try self.parseChunk(&payload, stream: stream, flags: header.flags))
        case .ack:
            let offset = try payload.readField(UInt64.self, "offset", of: type)
            try Self.expectEnd(payload, type)
            return .ack(Frame.Ack(streamID: stream, offset: try FieldRules.size(offset, "offset", of: type)))
        case .credit:
            let increment = try payload.readField(UInt32.self, "increment", of: type)
            try Self.expectEnd(payload, type)
            guard increment >= 1 && increment <= UInt32(ProtocolLimits.maxWindow) else {
                throw ProtocolError.connection(.protocolError, "CREDIT increment \(increment) is outside 1...2^31-1")
            }
            return .credit(Frame.Credit(streamID: stream, increment: increment))
        case .hash:
            let size = try payload.readField(UInt64.self, "size", of: type)
            let sha1 = try payload.readDigestBytes("sha1", of: type)
            try Self.expectEnd(payload, type)
            return .hash(
                Frame.Hash(streamID: stream, size: try FieldRules.size(size, "size", of: type), sha1: SHA1Digest(bytes: sha1)!)
            )
        case .result:
            let rawStatus = try payload.readField(UInt8.self, "status", of: type)
            let size = try payload.readField(UInt64.self, "size", of: type)
            let sha1 = try payload.readDigestBytes("sha1", of: type)
            let key = try payload.readBytes(lengthPrefix: 2, "key", of: type)
            try Self.expectEnd(payload, type)
            guard let status = Frame.Result.Status(rawValue: rawStatus) else {
                throw ProtocolError.connection(.protocolError, "RESULT status \(rawStatus) is not defined")
            }
            return .result(
                Frame.Result(
                    streamID: stream, status: status, size: try FieldRules.size(size, "size", of: type),
                    sha1: SHA1Digest(bytes: sha1)!, key: try FieldRules.string(key, max: Int(UInt16.max), "key", of: type)
                )
            )
        case .error, .cancel:
            let code = WireErrorCode(rawValue: try payload.readField(UInt16.self, "code", of: type))
            let message = try payload.readBytes(lengthPrefix: 2, "message", of: type)
            try Self.expectEnd(payload, type)
            let text = try FieldRules.string(message, max: self.limits.maxMessageLength, "message", of: type)
            if type == .error {
                return .error(Frame.Error(streamID: stream, code: code, message: text))
            }
            return .cancel(Frame.Cancel(streamID: stream, code: code, message: text))
        case .ping, .pong:
            let data = try payload.readField(UInt64.self, "data", of: type)
            try Self.expectEnd(payload, type)
            return type == .ping ? .ping(Frame.Ping(data: data)) : .pong(Frame.Pong(data: data))
        case .goAway:
            let last = try payload.readField(UInt32.self, "last stream id", of: type)
            let code = WireErrorCode(rawValue: try payload.readField(UInt16.self, "code", of: type))
            let message = try payload.readBytes(lengthPrefix: 2, "message", of: type)
            try Self.expectEnd(payload, type)
            guard last <= StreamID.maxID.rawValue else {
                throw ProtocolError.connection(.protocolError, "GOAWAY last stream id has the reserved top bit set")
            }
            let text = try FieldRules.string(message, max: self.limits.maxMessageLength, "message", of: type)
            return .goAway(Frame.GoAway(lastStreamID: StreamID(rawValue: last), code: code, message: text))
        case .plan:
            return .plan(try self.parsePlan(&payload, flags: header.flags))
        case .room:
            return .room(try self.parseRoom(&payload))
        default:
            // parseHeader let only extensions through besides the known types.
            let data = payload.readSlice(length: payload.readableBytes)!
            return .extension(Frame.Extension(type: type, flags: header.flags, streamID: stream, data: data))
        }
    }

    static func checkFrameSizeLimit(_ value: UInt32, _ type: FrameType) throws {
        guard value >= ProtocolLimits.smallestMaxFrameSize && value <= ProtocolLimits.largestMaxFrameSize else {
            throw ProtocolError.connection(
                .protocolError,
                "\(type.name) max frame size \(value) is outside \(ProtocolLimits.smallestMaxFrameSize)...\(ProtocolLimits.largestMaxFrameSize)"
            )
        }
    }

}

extension FrameDecoder: NIOSingleStepByteToMessageDecoder {
    public typealias InboundOut = Frame

    public mutating func decode(buffer: inout ByteBuffer) throws -> Frame? {
        try self.decodeFrame(from: &buffer)
    }

    public mutating func decodeLast(buffer: inout ByteBuffer, seenEOF: Bool) throws -> Frame? {
        try self.decodeFrame(from: &buffer)
    }
}
