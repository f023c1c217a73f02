import NIOConcurrencyHelpers

/// A lock that async code holds across suspension points: a waiter suspends (never blocks its thread) and the lock goes
/// to waiters in the order they came.
package final class AsyncLock: Sendable {
    private struct State {
        var held = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = NIOLockedValueBox(State())

    package init() {}

    /// Runs `body` holding the lock.
    package func withLock<T: Sendable>(_ body: () async throws -> T) async rethrows -> T {
        await self.lock()
        defer { self.unlock() }
        return try await body()
    }

    private func lock() async {
        let acquired = self.state.withLockedValue { state -> Bool in
            guard state.held else {
                state.held = true
                return true
            }
            return false
        }
        if acquired { return }
        await withCheckedContinuation { continuation in
            let now = self.state.withLockedValue { state -> Bool in
                guard state.held else {
                    state.held = true
                    return true
                }
                state.waiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Hands the lock to the first waiter, still held, or frees it.
    private func unlock() {
        let next = self.state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            guard !state.waiters.isEmpty else {
                state.held = false
                return nil
            }
            return state.waiters.removeFirst()
        }
        next?.resume()
    }
}
