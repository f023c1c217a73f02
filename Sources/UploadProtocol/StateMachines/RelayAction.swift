/// What the relay's connection must do after a frame arrived (SPEC §4).
///
/// The channel handler executes these in one `switch` and does nothing else.
public enum RelayAction: Hashable, Sendable {
    /// Nothing: the frame was absorbed (a PONG, an extension, a late frame on a reset stream).
    case none
    /// HELLO arrived with a version in common: check the credential, then call
    /// ``RelayConnectionStateMachine/acceptHello(account:)`` or ``RelayConnectionStateMachine/failConnection(_:_:)``.
    case authenticate(Frame.Hello)
    /// An agent opened a stream with a valid key: look the upload up (resume, dedup, quota), then call
    /// ``RelayConnectionStateMachine/sendOffset(_:)`` or ``RelayConnectionStateMachine/resetStream(_:_:_:)``.
    case openUpload(Frame.Open, ObjectKey)
    /// A chunk in order and within credit: check its CRC32, inflate it if deflated, hand it to storage,
    /// and call ``RelayConnectionStateMachine/storageConsumed(_:bytes:)`` when storage has taken it.
    case write(Frame.Chunk)
    /// The data is complete and its size matches: verify the SHA-1, commit, then
    /// ``RelayConnectionStateMachine/sendResult(_:)`` or ``RelayConnectionStateMachine/resetStream(_:_:_:)``.
    case finish(Frame.Hash)
    /// The agent closed a stream: with CANCEL (`discardSession`: forget its resume state) or ERROR (keep it).
    /// Write the connection CREDIT if any: the stream's received bytes that storage will now never consume
    /// (SPEC §5.4), so that a cancelled upload never shrinks the connection's window for good.
    case abortUpload(StreamID, WireErrorCode, String, discardSession: Bool, connectionCredit: Frame.Credit?)
    /// Write this frame (a PONG, or CREDIT returning bytes that were discarded).
    case send(Frame)
    /// A stream error: write the ERROR, then the connection CREDIT if any; abort that stream's upload,
    /// keeping its durable state. Other streams go on.
    case resetStream(Frame.Error, connectionCredit: Frame.Credit?)
    /// A connection error: write this ERROR on stream 0 and close; abort every upload, keeping durable state.
    case closeConnection(Frame.Error)
    /// The agent closed the connection with ERROR on stream 0: close; abort every upload, keeping durable state.
    case peerClosed(WireErrorCode, String)
    /// The agent will open no more streams.
    case peerGoingAway(Frame.GoAway)
    /// The agent asks what a selection would add to its quota use (SPEC §7.2): read the catalog, then call
    /// ``RelayConnectionStateMachine/sendRoom(_:)``.
    case plan(Frame.Plan)
}
