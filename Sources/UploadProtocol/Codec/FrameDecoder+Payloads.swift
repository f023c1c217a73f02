import NIOCore

/// The payloads with many fields, each read field by field and judged after its layout (SPEC §3).
extension FrameDecoder {
    func parseHello(_ payload: inout ByteBuffer) throws -> Frame.Hello {
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
            agentName: try FieldRules.display(name, max: self.limits.maxNameLength, "agent name", of: type)
        )
    }

    func parseWelcome(_ payload: inout ByteBuffer) throws -> Frame.Welcome {
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
            idleTimeoutMillis: idle, account: try FieldRules.display(account, max: self.limits.maxNameLength, "account", of: type)
        )
    }

    func parseOpen(_ payload: inout ByteBuffer, stream: StreamID, flags: UInt8) throws -> Frame.Open {
        let type = FrameType.open
        // The key's rules, UTF-8 included, are the relay's to check: a bad key closes one stream (SPEC §12.2).
        let key = try payload.readBytes(lengthPrefix: 2, "key", of: type)
        let size = try payload.readField(UInt64.self, "size", of: type)
        let sha1 = try payload.readDigestBytes("sha1", of: type)
        let fingerprint = try payload.readBytes(lengthPrefix: 1, "fingerprint", of: type)
        let token = try payload.readBytes(lengthPrefix: 1, "resume token", of: type)
        let isPart = flags & Frame.Open.partFlag != 0
        let part = isPart ? try payload.readField(UInt32.self, "part", of: type) : nil
        try Self.expectEnd(payload, type)
        let sizeKnown = flags & Frame.Open.sizeKnownFlag != 0
        let sha1Known = flags & Frame.Open.sha1KnownFlag != 0
        let probe = flags & Frame.Open.probeFlag != 0
        let striped = flags & Frame.Open.stripedFlag != 0
        guard sizeKnown || size == 0 else {
            throw ProtocolError.connection(.protocolError, "OPEN size is \(size) but SIZE_KNOWN is not set")
        }
        guard sha1Known || probe || sha1.allSatisfy({ $0 == 0 }) else {
            throw ProtocolError.connection(.protocolError, "OPEN sha1 is not zero but neither SHA1_KNOWN nor PROBE is set")
        }
        if probe {
            guard !sha1Known else { throw ProtocolError.connection(.protocolError, "OPEN sets both PROBE and SHA1_KNOWN") }
            guard sizeKnown, size > Frame.Open.probeLength else {
                throw ProtocolError.connection(
                    .protocolError, "OPEN with PROBE needs SIZE_KNOWN and a size above \(Frame.Open.probeLength) bytes"
                )
            }
        }
        // SPEC §3.3, §6.7.
        if striped || isPart {
            // Before any stripe arithmetic: the size's rule first.
            _ = try FieldRules.size(size, "size", of: type)
        }
        if striped {
            guard !isPart else { throw ProtocolError.connection(.protocolError, "OPEN sets both STRIPED and PART") }
            guard sizeKnown, size > Frame.Stripes(size: size).length else {
                throw ProtocolError.connection(
                    .protocolError, "OPEN with STRIPED needs SIZE_KNOWN and at least 2 stripes (a size above 16777216 bytes)")
            }
        }
        if let part {
            guard !sha1Known, !probe, flags & Frame.Open.overwriteFlag == 0 else {
                throw ProtocolError.connection(.protocolError, "OPEN with PART sets SHA1_KNOWN, PROBE or OVERWRITE")
            }
            guard sizeKnown, !token.isEmpty else {
                throw ProtocolError.connection(.protocolError, "OPEN with PART needs SIZE_KNOWN and the striped upload's resume token")
            }
            let count = Frame.Stripes(size: size).count
            guard part >= 1, Int(part) < count else {
                throw ProtocolError.connection(
                    .protocolError, "OPEN part \(part) is not a stripe after the first of a \(size)-byte blob (\(count) stripes)")
            }
        }
        let digest = SHA1Digest(bytes: sha1)
        return Frame.Open(
            streamID: stream, rawKey: key, size: sizeKnown ? try FieldRules.size(size, "size", of: type) : nil,
            sha1: sha1Known ? digest : nil, overwrite: flags & Frame.Open.overwriteFlag != 0,
            fingerprint: try FieldRules.length(fingerprint, max: self.limits.maxTokenLength, "fingerprint", of: type),
            resumeToken: try FieldRules.length(token, max: self.limits.maxTokenLength, "resume token", of: type),
            probe: probe ? digest : nil, striped: striped, part: part
        )
    }

    func parseOffset(_ payload: inout ByteBuffer, stream: StreamID) throws -> Frame.Offset {
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
        case .confirm where offset != 0 || !token.isEmpty:
            throw ProtocolError.connection(.protocolError, "OFFSET CONFIRM carries an offset or a resume token")
        default:
            return Frame.Offset(streamID: stream, disposition: disposition, offset: offset, resumeToken: token)
        }
    }

    /// `given`: the data, when it was gathered apart from the fields (``decodeGatheredChunk(prefix:data:)``); else the
    /// rest of `payload`.
    func parseChunk(_ payload: inout ByteBuffer, stream: StreamID, flags: UInt8, data given: ByteBuffer? = nil) throws -> Frame.Chunk {
        let type = FrameType.chunk
        let rawOffset = try payload.readField(UInt64.self, "offset", of: type)
        let crc = try payload.readField(UInt32.self, "crc32", of: type)
        var rawLength: UInt32? = nil
        if flags & Frame.Chunk.deflatedFlag != 0 {
            rawLength = try payload.readField(UInt32.self, "raw length", of: type)
        }
        let data = given ?? payload.readSlice(length: payload.readableBytes)!
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

    func parsePlan(_ payload: inout ByteBuffer, flags: UInt8) throws -> Frame.Plan {
        let type = FrameType.plan
        let request = try payload.readField(UInt32.self, "request", of: type)
        let count = try payload.readField(UInt16.self, "count", of: type)
        // Layout first (SPEC §1.9): every entry is located before any value is judged.
        var entries: [(key: [UInt8], size: UInt64)] = []
        entries.reserveCapacity(min(Int(count), ProtocolLimits.maxPlanEntries + 1))
        for _ in 0..<count {
            let key = try payload.readBytes(lengthPrefix: 2, "key", of: type)
            let size = try payload.readField(UInt64.self, "size", of: type)
            entries.append((key, size))
        }
        try Self.expectEnd(payload, type)
        guard entries.count <= ProtocolLimits.maxPlanEntries else {
            throw ProtocolError.connection(
                .protocolError, "PLAN has \(entries.count) entries; the limit is \(ProtocolLimits.maxPlanEntries)"
            )
        }
        return Frame.Plan(
            request: request, overwrite: flags & Frame.Plan.overwriteFlag != 0,
            entries: try entries.map { Frame.Plan.Entry(rawKey: $0.key, size: try FieldRules.size($0.size, "size", of: type)) }
        )
    }

    func parseRoom(_ payload: inout ByteBuffer) throws -> Frame.Room {
        let type = FrameType.room
        let request = try payload.readField(UInt32.self, "request", of: type)
        let quota = try payload.readField(UInt64.self, "quota", of: type)
        let used = try payload.readField(UInt64.self, "used", of: type)
        let count = try payload.readField(UInt16.self, "count", of: type)
        var needs: [UInt64] = []
        needs.reserveCapacity(Int(count))
        for _ in 0..<count {
            needs.append(try payload.readField(UInt64.self, "need", of: type))
        }
        try Self.expectEnd(payload, type)
        return Frame.Room(
            request: request, quota: quota == Frame.Room.noQuota ? nil : try FieldRules.size(quota, "quota", of: type),
            used: try FieldRules.size(used, "used", of: type), needs: try needs.map { try FieldRules.size($0, "need", of: type) }
        )
    }
}
