import Dispatch
import Glibc
import Synchronization

/// SIGHUP, caught from the start of `serve`: what it does is set once the relay is ready; one that came before runs
/// then. Unchecked: the dispatch source is only resumed and cancelled, which Dispatch allows from any thread; the rest
/// is behind the mutex.
final class Hangup: @unchecked Sendable {
    private let source: any DispatchSourceSignal
    /// Serial: a reload never runs beside another.
    private let queue = DispatchQueue(label: "upload-relay.sighup")
    private let state = Mutex<(action: (@Sendable () -> Void)?, pending: Bool)>((nil, false))

    init() {
        signal(SIGHUP, SIG_IGN)
        self.source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: self.queue)
        // The handler holds this object until the source is cancelled (Dispatch then lets its handlers go).
        self.source.setEventHandler {
            let action = self.state.withLock { state in
                if state.action == nil { state.pending = true }
                return state.action
            }
            action?()
        }
        self.source.resume()
    }

    /// From now on SIGHUP runs `action`; at once when one came before.
    func whenSignalled(_ action: @escaping @Sendable () -> Void) {
        let pending = self.state.withLock { state in
            state.action = action
            defer { state.pending = false }
            return state.pending
        }
        if pending { self.queue.async(execute: action) }
    }

    func cancel() {
        self.source.cancel()
    }
}
