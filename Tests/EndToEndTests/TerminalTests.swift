import Foundation
import Testing
import UploadTestSupport

/// What a person sees on a terminal: the agent run in tmux, its screen read with capture-pane.
@Suite("End to end: the agent on a terminal", .serialized)
struct TerminalTests {
    /// tmux on a socket of the test's own, so that nothing else's sessions are touched.
    struct Tmux {
        let socket = "upload-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"

        /// A tmux command: it answers at once, so it is waited for in line (also from `defer`).
        func run(_ arguments: [String]) throws -> String {
            try CommandLineTests.runNow("/usr/bin/tmux", ["-L", self.socket] + arguments).stdout
        }

        /// Starts the session. Through python3's subprocess, which closes every other descriptor: tmux's server, which
        /// outlives the call, must not inherit this process's pipes (Foundation's Process passes them on, and the
        /// call then waited for the session to end).
        func start(_ command: String) async throws {
            let launcher =
                "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode)"
            let started = try await CommandLineTests.run(
                "/usr/bin/env",
                ["python3", "-c", launcher, "/usr/bin/tmux", "-L", self.socket, "new-session", "-d", "-s", "agent", "-x", "120", "-y", "30", command]
            )
            guard started.status == 0 else {
                throw ChildProcess.ChildError(description: "tmux new-session exited \(started.status): \(started.stderr)")
            }
        }

        func screen() -> String {
            (try? self.run(["capture-pane", "-p", "-t", "agent"])) ?? ""
        }

        func stop() {
            _ = try? self.run(["kill-server"])
        }
    }

    @Test(
        "send on a terminal: a line per upload under way with its percentage, bytes and rate, a total line with the items done, bytes and percent; messages above it; all of it gone once the run ends, leaving the results and the summary"
    )
    func liveProgress() async throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/tmux") else {
            Issue.record("tmux is missing (apt-get install tmux): the terminal cannot be tested")
            return
        }
        let relay = try await CommandLineTests.DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        for index in 1...4 { _ = makeFile(source + "/clips", "clip\(index).mov", size: (3 << 20) + index * 100_000, seed: UInt64(40 + index)) }
        let tmux = Tmux()
        defer { tmux.stop() }
        let environment = relay.environment.map { "\($0.key)='\($0.value)'" }.joined(separator: " ")
        let command = "env \(environment) \(try CommandLineTests.agentBinary()) send --no-state --bwlimit 1M \(source)/clips; sleep 60"
        try await tmux.start(command)

        // Under way: a line per upload and the total line, below the messages. At 1 MB/s the run lasts about 13 s, so
        // that a machine busy with the whole suite still looks at the screen while it is under way.
        var during = ""
        let sawBlock = await AgentProcess.waitUntil(timeout: 20) {
            during = tmux.screen()
            let uploads = during.split(separator: "\n").filter {
                $0.range(of: #"^  +\d+% +[0-9.]+ [KM]?i?B / [0-9.]+ MiB +[0-9.]+ MB/s +clips/clip\d\.mov$"#, options: .regularExpression) != nil
            }
            let total = during.range(of: #"\[\d/4\] [0-9.]+ [KM]?i?B / 1[23]\.[0-9] MiB  \d+%  [0-9.]+ MB/s"#, options: .regularExpression) != nil
            return uploads.count >= 2 && total
        }
        let sessions = try await CommandLineTests.run("/usr/bin/tmux", ["-L", tmux.socket, "list-sessions"])
        #expect(sawBlock, "no live block:\n\(during)\ntmux: \(sessions.stdout) \(sessions.stderr)")
        #expect(during.contains("connected to 127.0.0.1"), "the messages are not above the block:\n\(during)")

        // Over: the results and the summary, no progress line left.
        var after = ""
        await #expect(
            AgentProcess.waitUntil(timeout: 60) {
                after = tmux.screen(); return after.contains("4 stored, 0 already there, 0 failed")
            }, "\(after)")
        let lines = after.split(separator: "\n").map(String.init)
        #expect(lines.filter { $0.hasPrefix("stored      clips/clip") }.count == 4, "\(after)")
        #expect(
            !lines.contains { $0.range(of: #"^  +\d+% "#, options: .regularExpression) != nil || $0.hasPrefix("[") },
            "the live block was left on the screen:\n\(after)")
    }
}
