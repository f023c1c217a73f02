import NIOCore

/// Frames of one stream: OPEN, CHUNK, HASH, CANCEL and ERROR, and frames for streams no longer open (SPEC §4, §5).
extension RelayConnectionStateMachine {
    mutating func receiveOpen(_ open: Frame.Open) -> RelayAction {
        let id = open.streamID
        guard id > self.highestStreamID else {
            return self.fail(.protocolError, "OPEN on stream \(id), not above the last stream \(self.highestStreamID)")
        }
        if open.probe != nil && !self.features.contains(.dedupProbe) {
            return self.fail(.protocolError, "OPEN with PROBE on stream \(id), but the dedup probe was not negotiated")
        }
        if (open.striped || open.part != nil) && !self.features.contains(.stripes) {
            return self.fail(.protocolError, "OPEN with STRIPED or PART on stream \(id), but stripes were not negotiated")
        }
        if self.agentGoAway != nil {
            return self.fail(.protocolError, "OPEN on stream \(id) after the agent's own GOAWAY")
        }
        self.highestStreamID = id
        if case .goingAway(let last) = self.phase, id > last {
            return self.refuse(id, .refusedStream, "the relay is going away; open stream \(id) on a new connection")
        }
        guard self.streams.count < self.limits.maxConcurrentStreams else {
            return self.refuse(
                id, .refusedStream, "\(self.streams.count) streams are open; the limit is \(self.limits.maxConcurrentStreams)"
            )
        }
        let key: ObjectKey
        do {
            key = try ObjectKey(
                validating: open.rawKey, maxLength: self.limits.maxKeyLength,
                maxSegmentLength: self.limits.maxKeySegmentLength
            )
        } catch {
            return self.refuse(id, .invalidKey, error.reason)
        }
        self.streams[id] = RelayStreamStateMachine(open: open)
        return .openUpload(open, key)
    }

    mutating func receiveChunk(_ chunk: Frame.Chunk) -> RelayAction {
        let id = chunk.streamID
        let length = chunk.payloadLength
        if chunk.isDeflated && !self.features.contains(.deflate) {
            return self.fail(.protocolError, "DEFLATED CHUNK on stream \(id), but deflate was not negotiated")
        }
        // SPEC §5.2: the connection window first; bytes on a stream we reset still count.
        guard self.connectionWindow.receive(length) else {
            return self.fail(
                .flowControlError,
                "CHUNK of \(length) bytes overruns the connection credit of \(self.connectionWindow.available) bytes"
            )
        }
        guard var stream = self.streams[id] else {
            if let action = self.lateFrame(id, .chunk) {
                return action
            }
            return self.connectionWindow.discard(length).map { .send(.credit(Frame.Credit(streamID: .connection, increment: $0))) } ?? .none
        }
        if let error = stream.receiveChunk(chunk) {
            if case .stream = error.scope {
                return self.reset(error, discarding: length)
            }
            return self.closeConnection(error)
        }
        self.streams[id] = stream
        return .write(chunk)
    }

    mutating func receiveHash(_ hash: Frame.Hash) -> RelayAction {
        guard var stream = self.streams[hash.streamID] else {
            return self.lateFrame(hash.streamID, .hash) ?? .none
        }
        if let error = stream.receiveHash(hash) {
            if case .stream = error.scope {
                return self.reset(error, discarding: 0)
            }
            return self.closeConnection(error)
        }
        self.streams[hash.streamID] = stream
        return .finish(hash)
    }

    mutating func receiveClose(
        _ id: StreamID, _ code: WireErrorCode, _ message: String, discard: Bool, type: FrameType
    ) -> RelayAction {
        guard self.streams[id] != nil else {
            return self.lateFrame(id, type) ?? .none
        }
        let credit = self.close(id, .abandoned)
        return .abortUpload(id, code, message, discardSession: discard, connectionCredit: credit)
    }

    /// A frame for a stream that is not open (SPEC §4.4): nil means "discard it".
    mutating func lateFrame(_ id: StreamID, _ type: FrameType) -> RelayAction? {
        guard id <= self.highestStreamID else {
            return self.fail(.protocolError, "\(type.name) on stream \(id), which was never opened")
        }
        switch self.closedStreams.reason(id) {
        case .finished where type == .cancel || type == .error:
            // It crossed our RESULT or OFFSET STORED (SPEC §4.7).
            return nil
        case .finished, .abandoned:
            return self.fail(.streamClosed, "\(type.name) on stream \(id), which is closed")
        case .resetLocally, nil:
            return nil
        }
    }
}
