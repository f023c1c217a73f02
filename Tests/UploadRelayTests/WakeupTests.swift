import Testing

@testable import UploadRelay

@Suite("Wakeup: the hook runner's signal with a time limit", .timeLimit(.minutes(1)))
struct WakeupTests {
    @Test("a signal before the wait counts once; none within the limit is false; one during the wait wakes it")
    func signalAndLimit() async {
        let wakeup = Wakeup()
        wakeup.signal()
        wakeup.signal()
        #expect(await wakeup.wait(upTo: .seconds(30)), "the earlier signal")
        #expect(await wakeup.wait(upTo: .milliseconds(20)) == false, "signals in between count once")
        async let woken = wakeup.wait(upTo: .seconds(30))
        // Signalled until the waiter took it: whether the signal came before or during the wait, it wakes this one.
        wakeup.signal()
        #expect(await woken)
    }

    @Test("waits cut short by their limit leave no waiter behind: a later signal wakes the next wait", arguments: 0..<20)
    func limitsThenSignal(round: Int) async {
        let wakeup = Wakeup()
        for _ in 0..<5 { #expect(await wakeup.wait(upTo: .microseconds(Int64(round * 50))) == false) }
        wakeup.signal()
        #expect(await wakeup.wait(upTo: .seconds(30)))
    }

    @Test("a cancelled wait without a limit ends, unsignalled")
    func cancelled() async {
        let wakeup = Wakeup()
        let task = Task { await wakeup.wait() }
        task.cancel()
        #expect(await task.value == false)
    }
}
