#if canImport(Glibc)
import Glibc
#endif
import NIOConcurrencyHelpers
import UploadProtocol

/// `--bwlimit`: a token bucket shared by every stream of a run, taken from as sources are read. Reads already wait
/// for the relay's credit; this makes them also wait for the limit, so the agent never sends faster than either.
///
/// The arithmetic is ``TokenBucket``, with the time passed in; this class only adds the lock and the clock.
final class BandwidthLimit: Sendable {
    private let bucket: NIOLockedValueBox<TokenBucket>
    private let clock = ContinuousClock()

    init(bytesPerSecond: Int) {
        self.bucket = NIOLockedValueBox(TokenBucket(bytesPerSecond: bytesPerSecond, now: ContinuousClock().now))
    }

    /// Takes `bytes` from the bucket, blocking this thread (one of the source pool's) until they may go.
    func take(_ bytes: Int) {
        let wait = self.bucket.withLockedValue { $0.take(bytes, now: self.clock.now) }
        guard wait > .zero else { return }
        let (seconds, attoseconds) = wait.components
        var request = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
        var remaining = timespec()
        // Interrupted by a signal: sleep what is left.
        while nanosleep(&request, &remaining) != 0 && errno == EINTR {
            request = remaining
        }
    }
}

/// A token bucket of bytes: `bytesPerSecond` flow in, up to a burst of a quarter second's worth (at least one chunk's
/// worth is always allowed to go into debt, so a chunk larger than the burst still goes, and waits are paid after).
struct TokenBucket: Sendable {
    let bytesPerSecond: Double
    let burst: Double
    private(set) var tokens: Double
    private var last: ContinuousClock.Instant

    init(bytesPerSecond: Int, now: ContinuousClock.Instant) {
        self.bytesPerSecond = Double(max(1, bytesPerSecond))
        self.burst = self.bytesPerSecond / 4
        self.tokens = self.burst
        self.last = now
    }

    /// Spends `bytes`; returns how long to wait before they may go (zero when the bucket held them).
    mutating func take(_ bytes: Int, now: ContinuousClock.Instant) -> Duration {
        let elapsed = now - self.last
        self.last = max(self.last, now)
        self.tokens = min(self.burst, self.tokens + max(0, elapsed.inSeconds) * self.bytesPerSecond)
        self.tokens -= Double(bytes)
        guard self.tokens < 0 else { return .zero }
        return .nanoseconds(Int64((-self.tokens / self.bytesPerSecond * 1e9).rounded(.up)))
    }
}
