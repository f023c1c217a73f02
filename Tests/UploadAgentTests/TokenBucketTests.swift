import Testing
import UploadTestSupport

@testable import UploadAgent

/// `--bwlimit`'s arithmetic, with the time passed in.
@Suite("Token bucket")
struct TokenBucketTests {
    @Test("a quarter second's burst goes at once; beyond it, each byte waits its share of a second")
    func burstThenRate() async {
        let start = ContinuousClock().now
        var bucket = TokenBucket(bytesPerSecond: 1000, now: start)
        #expect(bucket.take(250, now: start) == .zero)
        #expect(bucket.take(1000, now: start) == .seconds(1))
        // A second later the debt is paid; a tenth of a second's worth waits a tenth of a second.
        #expect(bucket.take(100, now: start + .seconds(1)) == .milliseconds(100))
        // Idle time refills no more than the burst.
        #expect(bucket.take(250, now: start + .seconds(60)) == .zero)
        #expect(bucket.take(1, now: start + .seconds(60)) == .milliseconds(1))
    }

    @Test("over any long run, bytes divided by the waits is the rate", arguments: [1, 7, 42])
    func longRun(seed: UInt64) async {
        var generator = SeededGenerator(seed: seed)
        let rate = 1 << 20
        var now = ContinuousClock().now
        let start = now
        var bucket = TokenBucket(bytesPerSecond: rate, now: now)
        var total = 0
        for _ in 0..<500 {
            let bytes = Int(generator.next() % UInt64(2 << 20)) + 1
            total += bytes
            now = now + bucket.take(bytes, now: now)
        }
        let seconds = Double((now - start).components.seconds) + Double((now - start).components.attoseconds) / 1e18
        // The sender sends each batch once its wait is over: the elapsed time is the bytes at the rate, minus the burst.
        let expected = Double(total - rate / 4) / Double(rate)
        #expect(abs(seconds - expected) < 0.01, "\(seconds) s for \(total) bytes; expected \(expected)")
    }
}
