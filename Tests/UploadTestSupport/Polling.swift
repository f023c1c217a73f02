import Foundation

/// Waiting for what another process or thread does after its answer went out (a lock let go, a hook run, a relay's
/// cleanup): the condition is asked every 20 ms until it holds or `timeout` seconds passed. Never a sleep standing in
/// for the event: each returns whether the condition came to hold.
public enum Polling {
    public static func waitUntil(timeout: Double = 30, _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if try condition() { return true }
            usleep(20_000)
        }
        return try condition()
    }

    /// ``waitUntil(timeout:_:)`` for async work: the condition awaited, and the wait a task's sleep, never a thread's.
    public static func waitUntil(timeout: Double = 30, _ condition: () async throws -> Bool) async rethrows -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if try await condition() { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return try await condition()
    }

    /// ``waitUntil(timeout:_:)`` for async conditions, sleeping as a task.
    public static func eventually(timeout: Double = 10, _ condition: () async throws -> Bool) async throws -> Bool {
        try await Self.waitUntil(timeout: timeout, condition)
    }
}

/// Runs blocking `body` (a wait for a child process, a read to the end of its pipe) on a thread of its own, so that the
/// awaiting task holds none of the cooperative pool's few threads, which the in-process relays' and agents' tasks need.
public func onThreadOfItsOwn<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            continuation.resume(with: Result { try body() })
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
}
