import ArgumentParser
#if canImport(Glibc)
import Glibc
#endif
import CUploadSystem
import FoundationEssentials
import UploadAgent
import UploadCommandLine
import UploadProtocol

@main
struct UploadAgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "upload-agent",
        abstract: "Upload files to an upload-relay: streamed, resumable, verified, never twice.",
        discussion: """
            Example:
              upload-agent send --relay relay.example.net:7443 --token "$TOKEN" --ca ca.pem ~/Pictures

            Exit status: 0 when every item was stored or was already there, 1 when any failed, 2 for a usage error.
            """,
        version: BuildInfo.versionLine("upload-agent"),
        subcommands: [Send.self, Watch.self, Status.self, Pause.self, Resume.self, Retry.self]
    )

    /// Usage errors exit 2, as scripts expect (ArgumentParser's own default is 64).
    static func main() async {
        Self.returnLargeBuffersAtOnce()
        let arguments: [String]
        do {
            arguments = try ConfigFile.expand(Array(CommandLine.arguments.dropFirst()))
        } catch {
            Platform.writeError(error)
            Glibc.exit(2)
        }
        await Self.mainExitingTwoOnUsageError(arguments)
    }

    /// Buffers of 256 KiB and more (a batch of a source, a CHUNK encrypted) are mapped on their own and unmapped when
    /// freed, instead of staying in malloc's arenas at their peak for the life of the process: the agent's resident
    /// memory follows what it holds now, which matters on a phone-class host running for days.
    static func returnLargeBuffersAtOnce() {
        _ = upload_set_malloc_thresholds(256 << 10, 0, 0)
    }
}

extension Platform {
    /// `error` on standard error as `upload-agent: …`, escaped: its words may be a relay's or a file's name.
    static func writeError(_ error: any Error) {
        Self.writeStandardError("upload-agent: \(Printable.escaped("\(error)"))\n")
    }
}
