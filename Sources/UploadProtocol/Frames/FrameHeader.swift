/// The ten bytes that open every frame (SPEC §1.1).
///
/// ```
///  0                   1                   2                   3
///  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
/// +---------------------------------------------------------------+
/// |               length (u32), header included                   |
/// +---------------+---------------+-------------------------------+
/// |   type (u8)   |  flags (u8)   |      stream id (u32) ...      |
/// +---------------+---------------+-------------------------------+
/// |      ... stream id            |  payload ...
/// +-------------------------------+
/// ```
public struct FrameHeader: Hashable, Sendable {
    /// Bytes in a header.
    public static let size = 10

    /// The whole frame's length, header included.
    public var length: Int
    public var type: FrameType
    public var flags: UInt8
    public var streamID: StreamID

    public init(length: Int, type: FrameType, flags: UInt8, streamID: StreamID) {
        self.length = length
        self.type = type
        self.flags = flags
        self.streamID = streamID
    }
}
