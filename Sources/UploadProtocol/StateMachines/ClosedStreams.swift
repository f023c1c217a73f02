/// How a stream closed, remembered so that a late frame can be told from a bad one (SPEC §4.4).
public enum StreamCloseReason: Hashable, Sendable {
    /// This side reset it (sent ERROR, or CANCEL for the agent): frames already in flight are discarded.
    case resetLocally
    /// It finished (the relay sent RESULT or OFFSET STORED; the agent received one, or ERROR):
    /// at the relay a crossing CANCEL or ERROR is discarded; anything else is STREAM_CLOSED.
    case finished
    /// The peer closed it (the relay received CANCEL or ERROR): any further frame is STREAM_CLOSED.
    case abandoned
}

/// A bounded memory of the most recently closed streams.
struct ClosedStreams: Sendable {
    private var reasons: [StreamID: StreamCloseReason] = [:]
    private var order: [StreamID] = []
    private var oldest = 0
    let capacity: Int

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    mutating func insert(_ id: StreamID, _ reason: StreamCloseReason) {
        if self.order.count < self.capacity {
            self.order.append(id)
        } else {
            self.reasons[self.order[self.oldest]] = nil
            self.order[self.oldest] = id
            self.oldest = (self.oldest + 1) % self.capacity
        }
        self.reasons[id] = reason
    }

    /// How `id` closed, or nil when it is forgotten (or never closed).
    func reason(_ id: StreamID) -> StreamCloseReason? {
        self.reasons[id]
    }
}
