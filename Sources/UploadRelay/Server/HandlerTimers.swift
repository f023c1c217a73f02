import NIOCore

/// A connection handler's armed timers, by key: arming a key again replaces its timer, and a timer that fired is
/// forgotten. Lives on the handler's event loop.
final class HandlerTimers<Key: Hashable> {
    private var scheduled: [Key: Scheduled<Void>] = [:]

    /// Arms `key` to call `fire` after `delay` on `loop` (nothing once the handler has no loop).
    func schedule(_ key: Key, in delay: TimeAmount, on loop: (any EventLoop)?, fire: @escaping () -> Void) {
        self.scheduled.removeValue(forKey: key)?.cancel()
        guard let loop else { return }
        self.scheduled[key] = loop.assumeIsolated().scheduleTask(in: delay) { [weak self] in
            self?.scheduled[key] = nil
            fire()
        }
    }

    func cancel(_ key: Key) {
        self.scheduled.removeValue(forKey: key)?.cancel()
    }
}

/// A weak reference to be captured where a strong one would make a cycle (a session's callback to its handler).
final class WeakBox<Value: AnyObject> {
    weak var value: Value?
}
