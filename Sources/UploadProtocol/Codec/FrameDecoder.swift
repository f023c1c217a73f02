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

    /// SPEC §1.3–§1.5: type, flags and stream id, checked before the payload is read.
    private static func parseHeader(_ buffer: ByteBuffer, length: Int) throws -> FrameHeader {
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
        case .hello, .welcome, .ping, .pong, .goAway:
            allowedFlags = 0
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

    private enum StreamRule {
        case connectionOnly, streamOnly, either
    }

    private static func expectEnd(_ payload: ByteBuffer, _ type: FrameType) throws {
        guard payload.readableBytes == 0 else {
            throw ProtocolError.connection(
                .frameSizeError, "\(type.name) payload has \(payload.readableBytes) bytes after its last field"
            )
        }
    }

    /// Reads every field (FRAME_SIZE_ERROR when the layout is off), then judges the values (SPEC §1.9).
    private func parsePayload(_ header: FrameHeader, _ payload: inout ByteBuffer) throws -> Frame {
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
        default:
            // parseHeader let only extensions through besides the known types.
            let data = payload.readSlice(length: payload.readableBytes)!
            return .extension(Frame.Extension(type: type, flags: header.flags, streamID: stream, data: data))
        }
    }

    private static func checkFrameSizeLimit(_ value: UInt32, _ type: FrameType) throws {
        guard value >= ProtocolLimits.smallestMaxFrameSize && value <= ProtocolLimits.largestMaxFrameSize else {
            throw ProtocolError.connection(
                .protocolError,
                "\(type.name) max frame size \(value) is outside \(ProtocolLimits.smallestMaxFrameSize)...\(ProtocolLimits.largestMaxFrameSize)"
            )
        }
    }

    private func parseHello(_ payload: inout ByteBuffer) throws -> Frame.Hello {
        let type = FrameType.hello
        guard let magic = payload.readBytes(length: 4) else {
            throw ProtocolError.connection(.frameSizeError, "HELLO payload ends inside magic")
        }
        let minVersion = try payload.readField(UInt16.self, "min version", of: type)
        let maxVersion = try payload.readField(UInt16.self, "max version", of: type)
        let maxFrameSize = try payload.readField(UInt32.self, "max frame size", of: type)
        let features = Frame.Features(rawValue: try payload.readField(UInt32.self, "features", of: type))
        let method = Frame.Hello.AuthMethod(rawValue: try payload.readField(UInt8.self, "auth method", of: type))
        let credential = try payload.readBytes(lengthPrefix: 2, "credential", of: type)
        let name = try payload.readBytes(lengthPrefix: 2, "agent name", of: type)
        try Self.expectEnd(payload, type)
        guard magic == Frame.magic else {
            throw ProtocolError.connection(.protocolError, "HELLO does not begin with \"UPLD\": the peer does not speak this protocol")
        }
        guard minVersion <= maxVersion else {
            throw ProtocolError.connection(.protocolError, "HELLO min version \(minVersion) is above max version \(maxVersion)")
        }
        try Self.checkFrameSizeLimit(maxFrameSize, type)
        return Frame.Hello(
            minVersion: minVersion, maxVersion: maxVersion, maxFrameSize: maxFrameSize, features: features,
            authMethod: method,
            credential: try FieldRules.length(credential, max: self.limits.maxCredentialLength, "credential", of: type),
            agentName: try FieldRules.string(name, max: self.limits.maxNameLength, "agent name", of: type)
        )
    }

    private func parseWelcome(_ payload: inout ByteBuffer) throws -> Frame.Welcome {
        let type = FrameType.welcome
        let version = try payload.readField(UInt16.self, "version", of: type)
        let maxFrameSize = try payload.readField(UInt32.self, "max frame size", of: type)
        let features = Frame.Features(rawValue: try payload.readField(UInt32.self, "features", of: type))
        let maxStreams = try payload.readField(UInt32.self, "max streams", of: type)
        let connectionWindow = try payload.readField(UInt32.self, "connection window", of: type)
        let streamWindow = try payload.readField(UInt32.self, "stream window", of: type)
        let maxKeyLength = try payload.readField(UInt16.self, "max key length", of: type)
        let idle = try payload.readField(UInt32.self, "idle timeout", of: type)
        let account = try payload.readBytes(lengthPrefix: 2, "account", of: type)
        try Self.expectEnd(payload, type)
        try Self.checkFrameSizeLimit(maxFrameSize, type)
        guard maxStreams >= 1 else {
            throw ProtocolError.connection(.protocolError, "WELCOME allows no streams")
        }
        for (name, window) in [("connection", connectionWindow), ("stream", streamWindow)] {
            guard window >= 1 && window <= UInt32(ProtocolLimits.maxWindow) else {
                throw ProtocolError.connection(.protocolError, "WELCOME \(name) window \(window) is outside 1...2^31-1")
            }
        }
        guard maxKeyLength >= 1 else {
            throw ProtocolError.connection(.protocolError, "WELCOME max key length is 0")
        }
        return Frame.Welcome(
            version: version, maxFrameSize: maxFrameSize, features: features, maxStreams: maxStreams,
            connectionWindow: connectionWindow, streamWindow: streamWindow, maxKeyLength: maxKeyLength,
            idleTimeoutMillis: idle, account: try FieldRules.string(account, max: self.limits.maxNameLength, "account", of: type)
        )
    }

    private func parseOpen(_ payload: inout ByteBuffer, stream: StreamID, flags: UInt8) throws -> Frame.Open {
        let type = FrameType.open
        // The key's rules, UTF-8 included, are the relay's to check: a bad key closes one stream (SPEC §12.2).
        let key = try payload.readBytes(lengthPrefix: 2, "key", of: type)
        let size = try payload.readField(UInt64.self, "size", of: type)
        let sha1 = try payload.readDigestBytes("sha1", of: type)
        let fingerprint = try payload.readBytes(lengthPrefix: 1, "fingerprint", of: type)
        let token = try payload.readBytes(lengthPrefix: 1, "resume token", of: type)
        try Self.expectEnd(payload, type)
        let sizeKnown = flags & Frame.Open.sizeKnownFlag != 0
        let sha1Known = flags & Frame.Open.sha1KnownFlag != 0
        guard sizeKnown || size == 0 else {
            throw ProtocolError.connection(.protocolError, "OPEN size is \(size) but SIZE_KNOWN is not set")
        }
        guard sha1Known || sha1.allSatisfy({ $0 == 0 }) else {
            throw ProtocolError.connection(.protocolError, "OPEN sha1 is not zero but SHA1_KNOWN is not set")
        }
        return Frame.Open(
            streamID: stream, rawKey: key, size: sizeKnown ? try FieldRules.size(size, "size", of: type) : nil,
            sha1: sha1Known ? SHA1Digest(bytes: sha1)! : nil, overwrite: flags & Frame.Open.overwriteFlag != 0,
            fingerprint: try FieldRules.length(fingerprint, max: self.limits.maxTokenLength, "fingerprint", of: type),
            resumeToken: try FieldRules.length(token, max: self.limits.maxTokenLength, "resume token", of: type)
        )
    }

    private func parseOffset(_ payload: inout ByteBuffer, stream: StreamID) throws -> Frame.Offset {
        let type = FrameType.offset
        let raw = try payload.readField(UInt8.self, "disposition", of: type)
        let rawOffset = try payload.readField(UInt64.self, "offset", of: type)
        let rawToken = try payload.readBytes(lengthPrefix: 1, "resume token", of: type)
        try Self.expectEnd(payload, type)
        guard let disposition = Frame.Offset.Disposition(rawValue: raw) else {
            throw ProtocolError.connection(.protocolError, "OFFSET disposition \(raw) is not defined")
        }
        let offset = try FieldRules.size(rawOffset, "offset", of: type)
        let token = try FieldRules.length(rawToken, max: self.limits.maxTokenLength, "resume token", of: type)
        switch disposition {
        case .start where offset != 0:
            throw ProtocolError.connection(.protocolError, "OFFSET START carries offset \(offset), not 0")
        case .resume where offset == 0:
            throw ProtocolError.connection(.protocolError, "OFFSET RESUME carries offset 0")
        case .stored where !token.isEmpty:
            throw ProtocolError.connection(.protocolError, "OFFSET STORED carries a resume token")
        default:
            return Frame.Offset(streamID: stream, disposition: disposition, offset: offset, resumeToken: token)
        }
    }

    private func parseChunk(_ payload: inout ByteBuffer, stream: StreamID, flags: UInt8) throws -> Frame.Chunk {
        let type = FrameType.chunk
        let rawOffset = try payload.readField(UInt64.self, "offset", of: type)
        let crc = try payload.readField(UInt32.self, "crc32", of: type)
        var rawLength: UInt32? = nil
        if flags & Frame.Chunk.deflatedFlag != 0 {
            rawLength = try payload.readField(UInt32.self, "raw length", of: type)
        }
        let data = payload.readSlice(length: payload.readableBytes)!
        let offset = try FieldRules.size(rawOffset, "offset", of: type)
        if let raw = rawLength {
            guard raw >= 1 && raw <= self.maxFrameSize else {
                throw ProtocolError.connection(
                    .protocolError, "CHUNK raw length \(raw) is outside 1...\(self.maxFrameSize)"
                )
            }
        }
        guard data.readableBytes > 0 else {
            throw ProtocolError.connection(.protocolError, "CHUNK carries no data")
        }
        let length = UInt64(rawLength.map(Int.init) ?? data.readableBytes)
        guard offset + length <= ProtocolLimits.maxBlobSize else {
            throw ProtocolError.connection(.protocolError, "CHUNK ends beyond 2^62")
        }
        return Frame.Chunk(streamID: stream, offset: offset, crc32: crc, rawLength: rawLength, data: data)
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
