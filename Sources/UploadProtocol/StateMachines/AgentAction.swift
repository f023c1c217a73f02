/// What the agent's connection must do after a frame arrived (SPEC §4).
public enum AgentAction: Hashable, Sendable {
    /// Nothing: the frame was absorbed.
    case none
    /// WELCOME arrived: the connection is ready on these terms.
    case connected(Frame.Welcome)
    /// The relay answered OPEN: START or RESUME (send from `offset`), or STORED (done, nothing to send).
    case offset(Frame.Offset)
    /// Bytes below `offset` of a stream are durable on the relay.
    case acknowledged(StreamID, offset: UInt64)
    /// Credit grew on a stream, or on every stream when the id is 0: sending may resume.
    case creditGranted(StreamID)
    /// The upload is committed and verified.
    case completed(Frame.Result)
    /// The relay failed one stream; the others go on.
    case streamFailed(StreamID, WireErrorCode, String)
    /// Write this frame (a PONG).
    case send(Frame)
    /// An agent-side stream error: write this ERROR on the stream and fail that upload.
    case resetStream(Frame.Error)
    /// A connection error: write this ERROR on stream 0 and close.
    case closeConnection(Frame.Error)
    /// The relay closed the connection with ERROR on stream 0 (bad token, version, timeout, violation).
    case peerClosed(WireErrorCode, String)
    /// The relay is going away: open nothing more; streams above `lastStreamID` were not processed.
    case goingAway(Frame.GoAway)
    /// The relay answered the agent's PLAN (SPEC §7.2).
    case room(Frame.Room)
}

/// What became of a frame the agent asked to send (``AgentConnectionStateMachine/sendChunk(_:)``).
public enum AgentSendDecision: Hashable, Sendable {
    /// Write this frame.
    case send(Frame)
    /// The stream closed or stopped sending meanwhile (reset, cancelled, GOAWAY): drop what was read for it.
    case streamGone
    /// The frame breaks the agent's own accounting (beyond its credit, at the wrong offset, past the size):
    /// nothing changed; cancel the stream with this reason rather than send it.
    case refused(String)
}
