import NIOCore
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// Connections sharing the relay's memory budget (SPEC §5.5): each connection's window moves toward the budget divided
/// among the connections, as storage consumes its bytes.
@Suite("Relay sessions: connection windows share the memory budget")
struct WindowShareTests {
    static let s1 = StreamID(rawValue: 1)
    static let budget = 1 << 20
    static let floor = 64 << 10

    /// One agent's connection, as the agent sees it: its credit, from WELCOME and CREDIT(0), less what it sent.
    struct Link {
        var h: SessionHarness
        var credit = 0
        var sent: UInt64 = 0
        /// The storage step under way on stream 1, if any (one at a time).
        var step: UploadPipeline.StorageStep? = nil
        /// CREDIT(0) increments received, in order.
        var grants: [Int] = []

        init(memory: ResourceBudget) {
            self.h = SessionHarness(
                configure: {
                    $0.limits.connectionWindow = WindowShareTests.budget
                    $0.limits.streamWindow = WindowShareTests.budget
                    $0.memoryBudget = WindowShareTests.budget
                    $0.minimumConnectionWindow = WindowShareTests.floor
                }, memory: memory)
            self.h.handshake()
            self.absorb(self.h.log)
            let opened = self.h.send(.open(Frame.Open(streamID: WindowShareTests.s1, key: "k", size: nil)))
            self.absorb(opened)
            self.absorb(
                self.h.take(
                    self.h.session.uploadLookedUp(
                        WindowShareTests.s1, .upload(durableOffset: 0, resumeToken: [1], resumed: false, byteLimit: nil),
                        key: try! ObjectKey(validating: "k"))))
        }

        mutating func absorb(_ actions: [RelaySession.Action]) {
            for frame in SessionHarness.frames(actions) {
                switch frame {
                case .welcome(let welcome): self.credit = Int(welcome.connectionWindow)
                case .credit(let credit) where credit.streamID == .connection:
                    self.credit += Int(credit.increment)
                    self.grants.append(Int(credit.increment))
                case .error(let error): Issue.record("unexpected ERROR \(error.code): \(error.message)")
                default: break
                }
            }
            for (_, step) in SessionHarness.steps(actions) {
                #expect(self.step == nil, "two storage steps at once")
                self.step = step
            }
        }

        /// Sends `count` bytes of CHUNK on stream 1, within the credit.
        mutating func send(_ count: Int) {
            guard count <= self.credit else {
                Issue.record("the test sends only what its credit allows")
                return
            }
            let chunk = Frame.Chunk(
                streamID: WindowShareTests.s1, offset: self.sent, crc32: 0, data: ByteBuffer(repeating: 7, count: count))
            self.credit -= count
            self.sent += UInt64(count)
            self.absorb(self.h.send(.chunk(chunk)))
        }

        /// Finishes the storage step under way, if any; false when there was none.
        @discardableResult
        mutating func finishStep() -> Bool {
            guard let step = self.step else { return false }
            self.step = nil
            switch step {
            case .write(let chunks, _):
                self.absorb(
                    self.h.take(self.h.session.storageFinished(WindowShareTests.s1, .wrote(consumed: chunks.map(\.payloadLength), error: nil))))
            case .sync(let offset):
                self.absorb(self.h.take(self.h.session.storageFinished(WindowShareTests.s1, .synced(.success(offset)))))
            default:
                Issue.record("unexpected storage step \(step)")
            }
            return true
        }

        /// Storage consumes everything sent so far.
        mutating func drain() {
            while self.finishStep() {}
        }

        mutating func close() {
            self.absorb(self.h.take(self.h.session.connectionClosed()))
        }
    }

    @Test(
        "a later connection starts at the floor; the first gives back as it consumes, the later one grows into it, and all of it returns to the first once the later one closes"
    )
    func twoConnections() {
        let memory = ResourceBudget(total: Self.budget)
        var a = Link(memory: memory)
        #expect(a.credit == Self.budget)
        var b = Link(memory: memory)
        #expect(b.credit == Self.floor, "the budget is spent: the floor")
        #expect(memory.inUse == Self.budget + Self.floor)

        // A's share is half now: consuming its first half returns nothing (its credit and held bytes fill the half).
        a.send(Self.budget / 2)
        a.drain()
        #expect(a.grants.isEmpty)
        // Its second half drained, A's window is the half: credit for it alone comes back.
        a.send(Self.budget / 2)
        #expect(a.credit == 0)
        a.drain()
        #expect(a.grants == [Self.budget / 2])
        #expect(a.h.session.machine.connectionWindowSize == Self.budget / 2)
        #expect(memory.inUse == Self.budget / 2 + Self.floor)

        // B grows into what A gave back: more credit than it sent.
        b.send(Self.floor)
        b.drain()
        #expect(b.grants == [Self.budget / 2])
        #expect(b.credit == Self.budget / 2)
        #expect(memory.inUse == Self.budget)

        // B leaves: A grows back to the whole budget.
        b.close()
        #expect(memory.inUse == Self.budget / 2)
        a.send(Self.budget / 2)
        a.drain()
        #expect(a.grants.last == Self.budget)
        #expect(a.credit == Self.budget)
        a.close()
        #expect(memory.inUse == 0 && memory.holders == 0)
    }

    /// Seeded: connections come and go and send what their credit allows while storage finishes in random orders. The
    /// budget taken stays within its total plus a floor per connection, no connection's held bytes pass its window,
    /// a connection whose bytes are all consumed holds more than half its window (never below the floor) in credit, and every byte goes back.
    @Test("random connections, sends and completions keep the budget's bounds", arguments: 0..<20)
    func randomShares(round: Int) {
        let seed = UInt64(0x5AFE_0000) + UInt64(round)
        var rng = SeededGenerator(seed: seed)
        let memory = ResourceBudget(total: Self.budget)
        var links: [Link] = [Link(memory: memory)]
        for _ in 0..<400 {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0 where links.count < 6:
                links.append(Link(memory: memory))
            case 1 where links.count > 1 && Int.random(in: 0..<3, using: &rng) == 0:
                var gone = links.remove(at: Int.random(in: 0..<links.count, using: &rng))
                gone.close()
            case 2...5:
                let i = Int.random(in: 0..<links.count, using: &rng)
                guard links[i].credit > 0 else { continue }
                links[i].send(Int.random(in: 1...min(links[i].credit, 96 << 10), using: &rng))
            default:
                let i = Int.random(in: 0..<links.count, using: &rng)
                links[i].finishStep()
            }
            #expect(memory.inUse <= Self.budget + memory.holders * Self.floor, "seed \(seed): the budget passed its bound")
            for link in links {
                let machine = link.h.session.machine
                #expect(machine.connectionWindowOutstanding <= link.h.session.grantedWindow, "seed \(seed): held more than taken")
                #expect(machine.connectionWindowOutstanding == link.credit + machine.bufferedBytes, "seed \(seed): credit disagrees")
            }
        }
        for i in links.indices {
            links[i].drain()
            // Below half its window, the credit owed would have been returned (SPEC §5.4's batching).
            let size = links[i].h.session.machine.connectionWindowSize
            #expect(size >= Self.floor, "seed \(seed): a window of \(size) bytes, below the floor")
            #expect(links[i].credit > size / 2, "seed \(seed): a drained connection holds \(links[i].credit) of credit, its window \(size)")
            links[i].close()
        }
        #expect(memory.inUse == 0 && memory.holders == 0, "seed \(seed): \(memory.inUse) bytes of budget not given back")
    }
}
