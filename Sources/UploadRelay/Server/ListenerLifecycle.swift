import NIOConcurrencyHelpers
import NIOCore
#if canImport(Glibc)
import Glibc
#endif

/// What connections that have not authenticated (strangers) may hold of a listener, in the way of sshd's
/// `MaxStartups` and nginx's `limit_conn`: a pool of their own beside the authenticated connections' places, so that
/// strangers never take those, and a cap per source address well below it, so that one source cannot take the pool.
public struct StrangerLimits: Sendable, Hashable {
    /// The most strangers from one source address (IPv4, or an IPv6 /64) at once; one more is refused at accept.
    public var perSource: Int
    /// The most strangers at once.
    public var total: Int
    /// When the pool is full: close the oldest stranger to admit the new one (a listener whose connections
    /// authenticate, so that idle strangers cannot keep an agent out), or refuse the new one (a listener where nothing
    /// authenticates as a whole, whose oldest connections are its honest long-lived clients).
    public var evictsOldest: Bool

    public init(perSource: Int, total: Int, evictsOldest: Bool = true) {
        self.perSource = perSource
        self.total = total
        self.evictsOldest = evictsOldest
    }
}

/// One listener's life, the same for the agents' server (``RelayServer``) and the HTTP endpoints
/// (``RelayStatusServer``), in the way of Hummingbird's `Server`: bound once (what fails, an address in use say, fails
/// the start and is told to whoever waits for the address), its connections admitted within ``StrangerLimits`` and
/// tracked until they close, then stopped at once (the listener closed, then the connections) or drained (each
/// connection asked to finish; the listener closes once the last has).
///
/// A connection starts as a stranger. One that authenticates (``authenticated(_:)``) moves to the places of
/// authenticated connections, at most ``maxConnections``; a listener without authentication keeps all its connections
/// strangers.
package final class ListenerLifecycle: Sendable {
    /// The connections open now, each a stranger or authenticated.
    struct Connections {
        struct Entry {
            var channel: any Channel
            /// The source address a stranger counts against; nil once authenticated.
            var strangerFrom: String?
            /// The order of admission: the smallest is the oldest.
            var admitted: UInt64
        }
        var entries: [ObjectIdentifier: Entry] = [:]
        var strangersBySource: [String: Int] = [:]
        var strangers = 0
        var next: UInt64 = 0

        var channels: [any Channel] { self.entries.values.map(\.channel) }
        var isEmpty: Bool { self.entries.isEmpty }
        var authenticated: Int { self.entries.count - self.strangers }

        /// Forgets `id`'s entry, whatever it was.
        mutating func remove(_ id: ObjectIdentifier) {
            guard let entry = self.entries.removeValue(forKey: id) else { return }
            if let source = entry.strangerFrom { self.forgetStranger(from: source) }
        }

        mutating func forgetStranger(from source: String) {
            self.strangers -= 1
            let left = (self.strangersBySource[source] ?? 1) - 1
            self.strangersBySource[source] = left > 0 ? left : nil
        }

        /// The oldest stranger, to close when the pool is full.
        func oldestStranger() -> ObjectIdentifier? {
            self.entries.lazy.filter { $0.value.strangerFrom != nil }.min { $0.value.admitted < $1.value.admitted }?.key
        }
    }

    private enum State {
        /// Not listening yet: callers of ``waitUntilListening()`` wait; `stopRequested` when a stop came first.
        case starting(waiting: [CheckedContinuation<SocketAddress, any Error>], stopRequested: Bool)
        /// Listening and admitting connections.
        case running(listener: any Channel, address: SocketAddress, connections: Connections)
        /// Admitting none; the listener closes when the last connection has.
        case draining(listener: any Channel, address: SocketAddress, connections: Connections)
        /// Over (or never bound: `address` nil).
        case stopped(address: SocketAddress?)

        var address: SocketAddress? {
            switch self {
            case .starting: return nil
            case .running(_, let address, _), .draining(_, let address, _): return address
            case .stopped(let address): return address
            }
        }
    }

    private let state = NIOLockedValueBox<State>(.starting(waiting: [], stopRequested: false))
    private let admittedTotal = NIOLockedValueBox(0)
    /// The most authenticated connections open at once; one more is refused when it authenticates.
    let maxConnections: Int
    let strangers: StrangerLimits

    package init(maxConnections: Int, strangers: StrangerLimits) {
        self.maxConnections = maxConnections
        self.strangers = strangers
    }

    /// Where it listens, once bound.
    var localAddress: SocketAddress? { self.state.withLockedValue { $0.address } }

    /// Connections admitted since it started (refused ones not counted).
    var connectionsAdmitted: Int { self.admittedTotal.withLockedValue { $0 } }

    /// The connections open now.
    var connections: [any Channel] {
        self.state.withLockedValue { state in
            switch state {
            case .running(_, _, let connections), .draining(_, _, let connections): return connections.channels
            case .starting, .stopped: return []
            }
        }
    }

    /// Waits until it listens, and returns where; throws when binding failed or it stopped first.
    func waitUntilListening() async throws -> SocketAddress {
        try await withCheckedThrowingContinuation { continuation in
            let ready = self.state.withLockedValue { state -> Result<SocketAddress, any Error>? in
                switch state {
                case .starting(var waiting, let stopRequested):
                    waiting.append(continuation)
                    state = .starting(waiting: waiting, stopRequested: stopRequested)
                    return nil
                case .running, .draining, .stopped:
                    return state.address.map { .success($0) } ?? .failure(RelayServerError.noAddress)
                }
            }
            if let ready { continuation.resume(with: ready) }
        }
    }

    /// The listener, bound by `bind` now unless it was already. A stop that came while binding closes it at once.
    func listen(_ bind: () async throws -> any Channel) async throws -> (listener: any Channel, address: SocketAddress) {
        if let bound = self.state.withLockedValue({ state -> (any Channel, SocketAddress)? in
            switch state {
            case .running(let listener, let address, _), .draining(let listener, let address, _): return (listener, address)
            case .starting, .stopped: return nil
            }
        }) {
            return bound
        }
        let listener: any Channel
        let address: SocketAddress
        do {
            listener = try await bind()
            guard let bound = listener.localAddress else {
                listener.close(promise: nil)
                throw RelayServerError.noAddress
            }
            address = bound
        } catch {
            // Nothing listens: whoever waits to hear where learns why.
            for continuation in self.settle({ $0 = .stopped(address: nil) }) { continuation.resume(throwing: error) }
            throw error
        }
        let waiting = self.settle { state in
            guard case .starting(_, let stopRequested) = state else { return }
            if stopRequested {
                // A stop came while binding: no connection was admitted; stop at once.
                state = .draining(listener: listener, address: address, connections: Connections())
                listener.close(promise: nil)
            } else {
                state = .running(listener: listener, address: address, connections: Connections())
            }
        }
        for continuation in waiting { continuation.resume(returning: address) }
        return (listener, address)
    }

    /// The continuations waiting while it was starting, with `change` applied to the state under the lock.
    private func settle(_ change: (inout State) -> Void) -> [CheckedContinuation<SocketAddress, any Error>] {
        self.state.withLockedValue { state in
            let waiting: [CheckedContinuation<SocketAddress, any Error>]
            if case .starting(let list, _) = state { waiting = list } else { waiting = [] }
            change(&state)
            return waiting
        }
    }

    /// Why a connection was not admitted.
    package enum Refusal: Error, Hashable, Sendable {
        /// Not listening, or draining.
        case notRunning
        /// Its source holds ``StrangerLimits/perSource`` strangers already.
        case sourceFull
        /// The strangers' pool is full, on a listener that does not evict.
        case poolFull
        /// It authenticated while the ``ListenerLifecycle/maxConnections`` places were all taken.
        case placesFull

        /// What the relay's log says of it.
        package var description: String {
            switch self {
            case .notRunning: "refusing connections: shutting down"
            case .sourceFull: "refusing connections: their source holds its most connections that have not authenticated"
            case .poolFull: "refusing connections: the listener holds its most connections"
            case .placesFull: "refusing connections: every place for an authenticated connection is taken (--max-connections)"
            }
        }
    }

    /// Whether `channel`, just accepted, may stay, as a stranger: it listens, admits, and its source holds fewer than
    /// ``StrangerLimits/perSource`` strangers. When the strangers' pool is full, its oldest is closed to make room. An
    /// admitted connection is tracked until it closes; the last one to close while draining closes the listener.
    func admit(_ channel: any Channel) -> Refusal? {
        let id = ObjectIdentifier(channel)
        let source = Self.source(of: channel.remoteAddress)
        let outcome = self.state.withLockedValue { state -> Result<(any Channel)?, Refusal> in
            guard case .running(let listener, let address, var connections) = state, listener.isActive else {
                return .failure(.notRunning)
            }
            guard connections.strangersBySource[source, default: 0] < self.strangers.perSource else { return .failure(.sourceFull) }
            var evicted: (any Channel)? = nil
            if connections.strangers >= self.strangers.total {
                guard self.strangers.evictsOldest, let oldest = connections.oldestStranger() else { return .failure(.poolFull) }
                evicted = connections.entries[oldest]?.channel
                connections.remove(oldest)
            }
            connections.entries[id] = Connections.Entry(channel: channel, strangerFrom: source, admitted: connections.next)
            connections.next += 1
            connections.strangers += 1
            connections.strangersBySource[source, default: 0] += 1
            state = .running(listener: listener, address: address, connections: connections)
            return .success(evicted)
        }
        let evicted: (any Channel)?
        switch outcome {
        case .failure(let refusal): return refusal
        case .success(let channel): evicted = channel
        }
        // Its entry is gone: its close counts for nothing more.
        evicted?.close(promise: nil)
        self.admittedTotal.withLockedValue { $0 += 1 }
        channel.closeFuture.whenComplete { _ in
            let listener = self.state.withLockedValue { state -> (any Channel)? in
                switch state {
                case .running(let listener, let address, var connections):
                    connections.remove(id)
                    state = .running(listener: listener, address: address, connections: connections)
                    return nil
                case .draining(let listener, let address, var connections):
                    connections.remove(id)
                    state = .draining(listener: listener, address: address, connections: connections)
                    return connections.isEmpty ? listener : nil
                case .starting, .stopped:
                    return nil
                }
            }
            listener?.close(promise: nil)
        }
        return nil
    }

    /// `channel` authenticated: it leaves the strangers' pool for a place among the authenticated connections. False
    /// when those are all taken (the caller closes it), or when it is no longer tracked (it was closed meanwhile).
    func authenticated(_ channel: any Channel) -> Bool {
        let id = ObjectIdentifier(channel)
        return self.state.withLockedValue { state -> Bool in
            let change = { (connections: inout Connections) -> Bool in
                guard var entry = connections.entries[id] else { return false }
                guard let source = entry.strangerFrom else { return true }
                guard connections.authenticated < self.maxConnections else { return false }
                connections.forgetStranger(from: source)
                entry.strangerFrom = nil
                connections.entries[id] = entry
                return true
            }
            switch state {
            case .running(let listener, let address, var connections):
                defer { state = .running(listener: listener, address: address, connections: connections) }
                return change(&connections)
            case .draining(let listener, let address, var connections):
                defer { state = .draining(listener: listener, address: address, connections: connections) }
                return change(&connections)
            case .starting, .stopped:
                return false
            }
        }
    }

    /// The address a stranger counts against: the IPv4 address, or the /64 of an IPv6 one (one host's usual share);
    /// a Unix socket's peers share one.
    static func source(of address: SocketAddress?) -> String {
        switch address {
        case .v4?:
            return address?.ipAddress ?? "?"
        case .v6(let v6)?:
            // An IPv4-mapped address is that IPv4 host.
            if let ip = address?.ipAddress, ip.hasPrefix("::ffff:"), ip.contains(".") { return String(ip.dropFirst(7)) }
            // The first 8 bytes of the IPv6 address, at its fixed place in `sockaddr_in6` (RFC 3493 §3.3: family, port
            // and flow label first).
            let prefix = withUnsafeBytes(of: v6.address) { Array($0[8..<16]) }
            return prefix.map { $0 < 16 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() + "/64"
        case .unixDomainSocket?, nil:
            return "local"
        }
    }

    /// Stops admitting and returns the connections to ask to finish (nil when it was not running: a stop before the
    /// listener is bound closes it as soon as it is). With none open, the listener closes now.
    func drain() -> [any Channel]? {
        let draining = self.state.withLockedValue { state -> (listener: any Channel, connections: [any Channel])? in
            switch state {
            case .starting(let waiting, _):
                state = .starting(waiting: waiting, stopRequested: true)
                return nil
            case .running(let listener, let address, let connections):
                state = .draining(listener: listener, address: address, connections: connections)
                return (listener, connections.channels)
            case .draining, .stopped:
                return nil
            }
        }
        guard let (listener, connections) = draining else { return nil }
        if connections.isEmpty { listener.close(promise: nil) }
        return connections
    }

    /// Stops at once: admits none and closes the listener (``finish()`` then closes what is left open).
    func stopNow() {
        let listener = self.state.withLockedValue { state -> (any Channel)? in
            switch state {
            case .starting(let waiting, _):
                state = .starting(waiting: waiting, stopRequested: true)
                return nil
            case .running(let listener, let address, let connections), .draining(let listener, let address, let connections):
                state = .draining(listener: listener, address: address, connections: connections)
                return listener
            case .stopped:
                return nil
            }
        }
        listener?.close(promise: nil)
    }

    /// The listener has closed: over. Returns the connections still open (for an immediate stop to close).
    @discardableResult
    func finish() -> [any Channel] {
        self.state.withLockedValue { state in
            defer { state = .stopped(address: state.address) }
            switch state {
            case .running(_, _, let connections), .draining(_, _, let connections): return connections.channels
            case .starting, .stopped: return []
            }
        }
    }
}
