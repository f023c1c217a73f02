import NIOConcurrencyHelpers
import NIOCore

/// One listener's life, the same for the agents' server (``RelayServer``) and the HTTP endpoints
/// (``RelayStatusServer``), in the way of Hummingbird's `Server`: bound once (what fails, an address in use say, fails
/// the start and is told to whoever waits for the address), its connections admitted up to a limit and tracked until
/// they close, then stopped at once (the listener closed, then the connections) or drained (each connection asked to
/// finish; the listener closes once the last has).
package final class ListenerLifecycle: Sendable {
    private enum State {
        /// Not listening yet: callers of ``waitUntilListening()`` wait; `stopRequested` when a stop came first.
        case starting(waiting: [CheckedContinuation<SocketAddress, any Error>], stopRequested: Bool)
        /// Listening and admitting connections.
        case running(listener: any Channel, address: SocketAddress, connections: [ObjectIdentifier: any Channel])
        /// Admitting none; the listener closes when the last connection has.
        case draining(listener: any Channel, address: SocketAddress, connections: [ObjectIdentifier: any Channel])
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
    /// The most connections open at once; one more is refused at accept.
    let maxConnections: Int

    package init(maxConnections: Int) {
        self.maxConnections = maxConnections
    }

    /// Where it listens, once bound.
    var localAddress: SocketAddress? { self.state.withLockedValue { $0.address } }

    /// Connections admitted since it started (refused ones not counted).
    var connectionsAdmitted: Int { self.admittedTotal.withLockedValue { $0 } }

    /// The connections open now.
    var connections: [any Channel] {
        self.state.withLockedValue { state in
            switch state {
            case .running(_, _, let connections), .draining(_, _, let connections): return Array(connections.values)
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
                state = .draining(listener: listener, address: address, connections: [:])
                listener.close(promise: nil)
            } else {
                state = .running(listener: listener, address: address, connections: [:])
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

    /// Whether `channel`, just accepted, may stay: it listens, admits, and is below ``maxConnections``. An admitted
    /// connection is tracked until it closes; the last one to close while draining closes the listener.
    func admit(_ channel: any Channel) -> Bool {
        let id = ObjectIdentifier(channel)
        let admitted = self.state.withLockedValue { state -> Bool in
            guard case .running(let listener, let address, var connections) = state, listener.isActive,
                connections.count < self.maxConnections
            else { return false }
            connections[id] = channel
            state = .running(listener: listener, address: address, connections: connections)
            return true
        }
        guard admitted else { return false }
        self.admittedTotal.withLockedValue { $0 += 1 }
        channel.closeFuture.whenComplete { _ in
            let listener = self.state.withLockedValue { state -> (any Channel)? in
                switch state {
                case .running(let listener, let address, var connections):
                    connections.removeValue(forKey: id)
                    state = .running(listener: listener, address: address, connections: connections)
                    return nil
                case .draining(let listener, let address, var connections):
                    connections.removeValue(forKey: id)
                    state = .draining(listener: listener, address: address, connections: connections)
                    return connections.isEmpty ? listener : nil
                case .starting, .stopped:
                    return nil
                }
            }
            listener?.close(promise: nil)
        }
        return true
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
                return (listener, Array(connections.values))
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
            case .running(_, _, let connections), .draining(_, _, let connections): return Array(connections.values)
            case .starting, .stopped: return []
            }
        }
    }
}
