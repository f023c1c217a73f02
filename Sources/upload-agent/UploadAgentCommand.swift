import ArgumentParser
import Foundation
import UploadCommandLine

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
        subcommands: [Send.self, Watch.self, Status.self, Pause.self, Resume.self, Retry.self]
    )

    /// Usage errors exit 2, as scripts expect (ArgumentParser's own default is 64).
    static func main() async {
        let arguments: [String]
        do {
            arguments = try ConfigFile.expand(Array(CommandLine.arguments.dropFirst()))
        } catch {
            FileHandle.standardError.write(Data("upload-agent: \(error)\n".utf8))
            Foundation.exit(2)
        }
        await Self.mainExitingTwoOnUsageError(arguments)
    }
}
