import Testing
import UploadTestSupport

@testable import UploadRelay

@Suite("Upload slots shared among accounts")
struct UploadSlotsTests {
    @Test("an account that took every slot it could leaves a newcomer its floor, and then only its share")
    func newcomerGetsIn() {
        let slots = UploadSlots(total: 100, floor: 10)
        var hog = 0
        while slots.take(for: "hog") { hog += 1 }
        #expect(hog == 75, "all but the newcomers' quarter")
        for _ in 0..<10 { #expect(slots.take(for: "new"), "a newcomer takes its floor while slots are free") }
        #expect(!slots.take(for: "new"), "past its floor only from outside the reserve, which the hog holds")
        // The hog's uploads end: it takes no slot back until it is down to its share (75 / 2 accounts).
        for _ in 0..<45 { slots.give(for: "hog") }
        #expect(slots.held(by: "hog") == 30)
        while slots.take(for: "hog") {}
        #expect(slots.held(by: "hog") == 37, "back up to its share of the 75, not to all of them")
        var newcomer = slots.held(by: "new")
        while slots.take(for: "new") { newcomer += 1 }
        #expect(newcomer == 37, "the newcomer grows to its share")
        #expect(slots.inUse == slots.held(by: "hog") + slots.held(by: "new"))
    }

    @Test("every slot can be taken; none is taken past the total, or given back twice")
    func bounds() {
        let slots = UploadSlots(total: 8, floor: 8)
        for _ in 0..<8 { #expect(slots.take(for: "a")) }
        #expect(!slots.take(for: "b"))
        slots.give(for: "b")
        #expect(slots.inUse == 8, "a slot b never took is not given back")
        slots.give(for: "a")
        #expect(slots.take(for: "b"))
        #expect(slots.held(by: "a") == 7 && slots.held(by: "b") == 1)
    }

    @Test("random takes and gives by several accounts: never more than the total, each account's count exact, seed printed")
    func randomOrder() {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("UploadSlotsTests.randomOrder seed \(seed)")
        var rng = SeededGenerator(seed: seed)
        let slots = UploadSlots(total: 40, floor: 6)
        var held: [String: Int] = [:]
        for _ in 0..<5_000 {
            let account = ["a", "b", "c", "d"][Int(rng.next() % 4)]
            if rng.next() % 2 == 0 {
                if slots.take(for: account) { held[account, default: 0] += 1 }
            } else if held[account, default: 0] > 0 {
                slots.give(for: account)
                held[account, default: 0] -= 1
            }
            #expect(slots.inUse <= 40, "seed \(seed)")
            #expect(slots.inUse == held.values.reduce(0, +), "seed \(seed)")
        }
        for (account, count) in held { #expect(slots.held(by: account) == count, "seed \(seed)") }
        // Whatever the others hold, an account holding none gets one while any slot is free.
        if slots.inUse < 40 { #expect(slots.take(for: "newcomer"), "seed \(seed)") }
    }
}
