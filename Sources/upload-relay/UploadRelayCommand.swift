import ArgumentParser
import CUploadSystem
import Foundation
import UploadCommandLine
import Synchronization

@main
struct UploadRelayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "upload-relay",
        abstract: "Accept uploads from upload-agent over TLS and commit verified blobs to storage.",
        discussion: """
            Try it on one machine:
              upload-relay serve --dev --data ./relay-data
            then, as it prints:
              upload-agent send --relay 127.0.0.1:7443 --ca ./relay-data/dev/ca.pem \\
                  --token "$(cat ./relay-data/dev/token)" ~/Pictures

            On a server, use real certificates and one token per device:
              upload-relay token add camera-7 --data /srv/upload --quota 50G
              upload-relay serve --data /srv/upload --cert fullchain.pem --key privkey.pem
            and see what is stored and under way:
              upload-relay ls --data /srv/upload --in-progress
            """,
        version: BuildInfo.versionLine("upload-relay"),
        subcommands: [Serve.self, Token.self, ListCommand.self, Remove.self]
    )

    /// Usage errors exit 2, as scripts expect (ArgumentParser's own default is 64). `serve` takes its options from
    /// `--config FILE` and `UPLOAD_RELAY_*` too (``ServeConfig``).
    static func main() async {
        Self.keepBuffersInTheHeap()
        let arguments: [String]
        do {
            arguments = try ServeConfig.expand(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
        } catch {
            FileHandle.standardError.write(Data("upload-relay: \(error)\n".utf8))
            Glibc.exit(2)
        }
        await Self.mainExitingTwoOnUsageError(arguments) { ServeConfig.valuesRead.withLock { $0 } }
    }

    /// TLS's plaintext buffers (each read took a new one while the frames' chunks were slices of them) and the staging
    /// writes' buffers come from malloc's heap, up to 4 MiB each, and a heap keeps up to 16 MiB free at its top: with
    /// glibc's moving thresholds most of them were mapped afresh, a page fault and a zeroed page per 4 KiB (53,000 per
    /// GiB uploaded, 6 % of the relay's CPU; 4,000 to 13,000 now, the peak resident memory unchanged, 64 MiB).
    ///
    /// All threads share one arena: the event loops allocate the chunks, the I/O threads free them once written, and
    /// with an arena per thread (glibc's default, up to 16 on 2 cores) each arena kept its own free memory at the peak.
    /// With 100 agents at once (`tools/bench-many.sh`) the relay's peak resident memory was 124 to 135 MiB with an
    /// arena per thread and 105 to 117 MiB with one, for the same CPU (one 1 GiB upload, 1,000 files of 1 MiB and
    /// 10,000 of 16 KiB). `MALLOC_ARENA_MAX`, or `glibc.malloc.arena_max` in `GLIBC_TUNABLES`, still decides when set.
    static func keepBuffersInTheHeap() {
        let environment = ProcessInfo.processInfo.environment
        let told = environment["MALLOC_ARENA_MAX"] != nil || (environment["GLIBC_TUNABLES"] ?? "").contains("arena_max")
        let arenas = told ? 0 : 1
        _ = upload_set_malloc_thresholds(4 << 20, 16 << 20, Int32(arenas))
    }
}
